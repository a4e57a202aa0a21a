//! Decode throughput of a span over every layer of a model, paired with the
//! same layers through stage 1 (per-matmul submits, CPU attention) in the
//! same process. The output projection is not included in either.
//!
//! `span_decode MODEL [STEPS]`; FISH_GPU_PROFILE=2 adds the stage profile.

use std::sync::Arc;
use std::time::Instant;

use fish_core::backend::ComputeBackend;
use fish_core::model::layer_range::{embed_tokens, forward_layers};
use fish_core::model::{Model, PlacementLimits};
use fish_span::VulkanBackend;

const N_CTX: usize = 512;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: span_decode MODEL [STEPS]")?;
    let steps: usize = args.next().map_or(Ok(64), |s| s.parse())?;
    let gpu = Arc::new(VulkanBackend::open_owned()?);
    let mut model = Model::load(&path)?;
    model.place_on(gpu.clone(), PlacementLimits::default());
    let n_layer = model.cfg.n_layer;
    let placement = model.gpu.as_ref().ok_or("not placed")?;
    if placement.n_layers_placed() != n_layer {
        return Err(format!("{}/{n_layer} layers placed", placement.n_layers_placed()).into());
    }
    let spec = model.span_spec(0, N_CTX).ok_or("not placed")?;
    let span = gpu.as_span().ok_or("no spans")?;
    let bytes = span.span_begin(&spec)?;
    println!("{}", gpu.describe());
    println!("span reserved {} MB", bytes >> 20);

    let prompt: Vec<u32> = (0..16).map(|i| 100 + i).collect();
    let mut x = embed_tokens(&model, &prompt)?;
    let t = Instant::now();
    span.span_forward(&mut x, prompt.len(), 0)?;
    let prefill = t.elapsed().as_secs_f64();
    println!(
        "span prefill {} tokens: {:.2} ms ({:.0} tok/s)",
        prompt.len(),
        prefill * 1e3,
        prompt.len() as f64 / prefill
    );

    let decode =
        |n: usize, run: &mut dyn FnMut(usize) -> Result<(), Box<dyn std::error::Error>>| {
            // The first step warms up; it is not counted.
            run(0)?;
            let t = Instant::now();
            for i in 1..=n {
                run(i)?;
            }
            Ok::<f64, Box<dyn std::error::Error>>(n as f64 / t.elapsed().as_secs_f64())
        };
    let pos0 = prompt.len();
    let span_tps = decode(steps, &mut |i| {
        let mut x = embed_tokens(&model, &[200 + i as u32])?;
        span.span_forward(&mut x, 1, pos0 + i)?;
        Ok(())
    })?;
    println!("span decode: {span_tps:.1} tok/s over {steps} steps");
    if let Some(p) = span.span_profile() {
        println!("profile (last step): {p}");
    }
    span.span_end();

    let mut cache = model.new_cache(N_CTX);
    let mut x = embed_tokens(&model, &prompt)?;
    forward_layers(&model, &mut cache, &mut x, 0, 0..n_layer)?;
    let stage1_tps = decode(steps, &mut |i| {
        let mut x = embed_tokens(&model, &[200 + i as u32])?;
        forward_layers(&model, &mut cache, &mut x, pos0 + i, 0..n_layer)?;
        Ok(())
    })?;
    println!("stage 1 decode: {stage1_tps:.1} tok/s over {steps} steps");
    println!("span / stage 1: {:.2}x", span_tps / stage1_tps);
    Ok(())
}
