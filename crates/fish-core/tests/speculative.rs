//! Speculative decoding on the CPU: greedy output identical to plain greedy
//! decoding (a draft identical to the target, and a re-quantised draft that
//! disagrees now and then), batched verification equal to one-token decode,
//! sampling with a matching draft, and a clear error for unpaired vocabularies.

mod common;

use std::path::{Path, PathBuf};

use fish_core::generate::{generate, Flow, GenerateOptions, StopReason};
use fish_core::model::{LogitsFor, Model};
use fish_core::sampling::SamplerConfig;
use fish_core::session::Session;
use fish_core::spec_controller::DraftLength;
use fish_core::speculative::{
    check_vocab, generate_speculative, SpeculativeError, SpeculativeOptions, SpeculativeStats,
};
use fish_core::tokenizer::{EncodeOptions, Tokenizer};
use fish_gguf::{GgmlType, Gguf, GgufWriter, TensorSpec};

const N_CTX: usize = 256;
const PROSE: &str = "The old lighthouse keeper climbed the stairs every evening, and";
const JSON: &str =
    "Here is the user record as JSON: {\"name\": \"Ada\", \"age\": 36, \"languages\": [";

fn plain(model: &Model, prompt: &[u32], n: usize, tok: &Tokenizer) -> Vec<u32> {
    let mut session = Session::new(model, N_CTX, 2).expect("session");
    let opts = GenerateOptions {
        n_predict: n,
        sampler: SamplerConfig::greedy(),
    };
    let mut out = Vec::new();
    generate(
        &mut session,
        prompt,
        &opts,
        |t| tok.is_eog(t),
        |t| {
            out.push(t);
            Flow::Continue
        },
    )
    .expect("generate");
    out
}

fn speculative(
    target: &Model,
    draft: &Model,
    prompt: &[u32],
    opts: &SpeculativeOptions,
    tok: &Tokenizer,
) -> (Vec<u32>, SpeculativeStats) {
    let mut ts = Session::new(target, N_CTX, 2).expect("target session");
    let mut ds = Session::new(draft, N_CTX, 2).expect("draft session");
    let mut out = Vec::new();
    let stats = generate_speculative(
        &mut ts,
        &mut ds,
        prompt,
        opts,
        |t| tok.is_eog(t),
        |t| {
            out.push(t);
            Flow::Continue
        },
    )
    .expect("speculative generation");
    // The target keeps the committed context, at most missing the newest token.
    let committed: Vec<u32> = prompt.iter().chain(&out).copied().collect();
    assert!(
        ts.n_past() + 1 >= committed.len(),
        "{} of {}",
        ts.n_past(),
        committed.len()
    );
    assert_eq!(ts.tokens(), &committed[..ts.n_past()]);
    (out, stats)
}

fn greedy_opts(n_predict: usize, draft: DraftLength) -> SpeculativeOptions {
    SpeculativeOptions {
        n_predict,
        sampler: SamplerConfig::greedy(),
        draft,
    }
}

fn policies() -> [DraftLength; 3] {
    [
        DraftLength::Fixed(3),
        DraftLength::Fixed(7),
        DraftLength::Adaptive {
            n_min: 1,
            n_max: 16,
        },
    ]
}

/// A copy of `src` with every Q4_1 matrix re-quantised to Q4_0: close enough
/// to draft well, different enough that some drafts are rejected.
fn requantised_copy(src: &Path) -> PathBuf {
    let g = Gguf::open(src).expect("open");
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.kv(k, v.to_owned_value());
    }
    let new_ty = |t: GgmlType| {
        if t == GgmlType::Q4_1 {
            GgmlType::Q4_0
        } else {
            t
        }
    };
    for t in g.tensors() {
        w.tensor(TensorSpec::new(&t.name, &t.dims, new_ty(t.ty)));
    }
    let path = std::env::temp_dir().join(format!("fish-spec-draft-{}.gguf", std::process::id()));
    let file = std::fs::File::create(&path).expect("create draft file");
    w.write(std::io::BufWriter::new(file), |i, spec, out| {
        let info = &g.tensors()[i];
        let data = g.tensor_data(info);
        if spec.ty == info.ty {
            return out.write_all(data);
        }
        let n = info.row_len() as usize;
        let src_row = data.len() / info.n_rows() as usize;
        let mut vals = vec![0f32; n];
        let mut dst = vec![0u8; fish_quant::row_bytes(spec.ty, n).expect("row bytes")];
        for row in data.chunks_exact(src_row) {
            fish_quant::dequant_row(info.ty, row, &mut vals).expect("dequant");
            fish_quant::quantize_row(spec.ty, &vals, &mut dst).expect("quantize");
            out.write_all(&dst)?;
        }
        Ok(())
    })
    .expect("write draft");
    path
}

#[test]
fn batched_verification_equals_one_token_decode() {
    let model = Model::load(common::default_model()).expect("load");
    let tok = Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
    let prompt = tok.encode(PROSE, EncodeOptions::PROMPT);
    let next: Vec<u32> = plain(&model, &prompt, 12, &tok);
    assert_eq!(next.len(), 12);

    let mut batched = Session::new(&model, N_CTX, 2).expect("session");
    batched.set_prompt(&prompt).expect("prompt");
    let rows = batched.eval(&next, LogitsFor::All).expect("batch");
    let n_vocab = model.cfg.n_vocab;

    let mut single = Session::new(&model, N_CTX, 2).expect("session");
    single.set_prompt(&prompt).expect("prompt");
    for (i, &t) in next.iter().enumerate() {
        let one = single.eval(&[t], LogitsFor::Last).expect("one token");
        let row = &rows[i * n_vocab..][..n_vocab];
        assert_eq!(
            fish_core::sampling::argmax(row),
            fish_core::sampling::argmax(&one),
            "row {i}"
        );
        assert!(
            row.iter()
                .zip(&one)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "row {i}: batched logits differ from one-token decode"
        );
    }
}

#[test]
fn greedy_with_identical_draft_equals_plain_greedy() {
    let model = Model::load(common::default_model()).expect("load");
    let tok = Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
    for text in [PROSE, JSON] {
        let prompt = tok.encode(text, EncodeOptions::PROMPT);
        let want = plain(&model, &prompt, 40, &tok);
        for policy in policies() {
            let (got, stats) = speculative(&model, &model, &prompt, &greedy_opts(40, policy), &tok);
            assert_eq!(got, want, "{policy:?} on {text:?}");
            assert_eq!(stats.acceptance_rate(), 1.0, "{policy:?}: {stats:?}");
            assert!(stats.tokens_per_target_forward() > 2.0, "{stats:?}");
        }
    }
}

#[test]
fn greedy_with_requantised_draft_equals_plain_greedy() {
    let target = Model::load(common::default_model()).expect("load");
    let draft_path = requantised_copy(&common::default_model());
    let draft = Model::load(&draft_path).expect("load draft");
    let _ = std::fs::remove_file(&draft_path);
    let tok = Tokenizer::from_gguf(&target.gguf).expect("tokenizer");
    let draft_tok = Tokenizer::from_gguf(&draft.gguf).expect("draft tokenizer");
    check_vocab(&tok, &draft_tok).expect("same vocabulary");

    let mut rejected_somewhere = false;
    for text in [PROSE, JSON] {
        let prompt = tok.encode(text, EncodeOptions::PROMPT);
        let want = plain(&target, &prompt, 48, &tok);
        for policy in policies() {
            let (got, stats) =
                speculative(&target, &draft, &prompt, &greedy_opts(48, policy), &tok);
            assert_eq!(got, want, "{policy:?} on {text:?}");
            assert!(stats.n_accepted <= stats.n_drafted);
            assert!(stats.acceptance_rate() > 0.3, "{policy:?}: {stats:?}");
            rejected_somewhere |= stats.n_accepted < stats.n_drafted;
            eprintln!(
                "{policy:?}: acceptance {:.2}, mean draft {:.2}, {:.2} tokens/forward",
                stats.acceptance_rate(),
                stats.mean_draft_len(),
                stats.tokens_per_target_forward()
            );
        }
    }
    assert!(rejected_somewhere, "the re-quantised draft never disagreed");

    // The same two sessions across prompts: each run starts from whatever the
    // previous one left in both caches (prefix reuse, rejected drafts dropped).
    let mut ts = Session::new(&target, N_CTX, 2).expect("target session");
    let mut ds = Session::new(&draft, N_CTX, 2).expect("draft session");
    let adaptive = greedy_opts(
        24,
        DraftLength::Adaptive {
            n_min: 2,
            n_max: 16,
        },
    );
    for text in [PROSE, JSON, PROSE] {
        let prompt = tok.encode(text, EncodeOptions::PROMPT);
        let mut got = Vec::new();
        generate_speculative(
            &mut ts,
            &mut ds,
            &prompt,
            &adaptive,
            |t| tok.is_eog(t),
            |t| {
                got.push(t);
                Flow::Continue
            },
        )
        .expect("speculative generation");
        assert_eq!(
            got,
            plain(&target, &prompt, 24, &tok),
            "reused sessions on {text:?}"
        );
    }

    // Sampling with rejections: reproducible for a seed, and within the limit.
    let sampled = SpeculativeOptions {
        n_predict: 32,
        sampler: SamplerConfig {
            temperature: 1.0,
            seed: 3,
            ..Default::default()
        },
        draft: DraftLength::Fixed(4),
    };
    let prompt = tok.encode(PROSE, EncodeOptions::PROMPT);
    let (a, stats) = speculative(&target, &draft, &prompt, &sampled, &tok);
    let (b, _) = speculative(&target, &draft, &prompt, &sampled, &tok);
    assert_eq!(a, b, "same seed, same tokens");
    assert!(a.len() <= 32 && !a.is_empty());
    assert!(stats.n_accepted < stats.n_drafted, "{stats:?}");
}

#[test]
fn sampling_with_identical_draft_accepts_everything() {
    let model = Model::load(common::default_model()).expect("load");
    let tok = Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
    let prompt = tok.encode(PROSE, EncodeOptions::PROMPT);
    let opts = SpeculativeOptions {
        n_predict: 32,
        sampler: SamplerConfig {
            temperature: 0.9,
            seed: 11,
            ..Default::default()
        },
        draft: DraftLength::Fixed(4),
    };
    let (a, stats) = speculative(&model, &model, &prompt, &opts, &tok);
    // p == q for every drafted token, so each is kept.
    assert_eq!(stats.acceptance_rate(), 1.0, "{stats:?}");
    if stats.generation.stop == StopReason::TokenLimit {
        assert_eq!(a.len(), 32);
    }
    let (b, _) = speculative(&model, &model, &prompt, &opts, &tok);
    assert_eq!(a, b, "same seed, same tokens");
}

#[test]
fn unpaired_vocabularies_are_refused() {
    let smol = Gguf::open(common::default_model()).expect("open");
    let Some(other) = common::optional_model("gemma3", "gemma-3-270m-q4_k_m.gguf") else {
        return;
    };
    let other = Gguf::open(other).expect("open");
    let a = Tokenizer::from_gguf(&smol).expect("tokenizer");
    let b = Tokenizer::from_gguf(&other).expect("tokenizer");
    let err = check_vocab(&a, &b).expect_err("different vocabularies");
    assert!(matches!(err, SpeculativeError::VocabSize { .. }), "{err}");
    check_vocab(&a, &a).expect("a vocabulary pairs with itself");
}
