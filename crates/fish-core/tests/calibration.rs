//! Calibration: every matrix gets one non-negative energy per input column,
//! matrices sharing an input agree, and the energy is the mean of x².

mod common;
use fish_core::model::calibration::calibrate;
use fish_core::model::Model;

#[test]
fn every_matrix_gets_its_input_energy() {
    let model = Model::load(common::default_model()).unwrap();
    let imp = calibrate(&model, &[1, 42, 300, 7, 99, 1000]).unwrap();
    let w = &model.weights;
    for (l, lw) in w.layers.iter().enumerate() {
        for m in [
            &lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down,
        ] {
            let v = imp
                .get(&m.info.name)
                .unwrap_or_else(|| panic!("{}", m.info.name));
            assert_eq!(v.len(), m.n_in, "layer {l} {}", m.info.name);
            assert!(v.iter().all(|e| e.is_finite() && *e >= 0.0));
            assert!(v.iter().any(|&e| e > 0.0), "{}", m.info.name);
        }
        assert_eq!(imp.get(&lw.wq.info.name), imp.get(&lw.wv.info.name));
        assert_eq!(imp.get(&lw.w_gate.info.name), imp.get(&lw.w_up.info.name));
    }
    // The output projection sees the final-normed hidden states.
    let out = imp.get(&w.output.info.name).unwrap();
    assert_eq!(out.len(), model.cfg.n_embd);
    assert!(calibrate(&model, &[]).is_err());
}
