//! Opening a model for the commands: weights, tokenizer, chat template, load time.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fish_core::chat::ChatTemplate;
use fish_core::model::{Model, PlacementLimits};
use fish_core::tokenizer::Tokenizer;
use fish_gguf::Gguf;

use crate::args::GpuArgs;

pub struct Loaded {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub load_time: Duration,
}

/// Loads a model and, unless FISH_GPU disables it or no device opens,
/// places what fits on the GPU.
pub fn load(path: &Path, gpu: &GpuArgs) -> Result<Loaded> {
    let t0 = Instant::now();
    let gguf = Arc::new(Gguf::open(path).with_context(|| path.display().to_string())?);
    let tokenizer = Tokenizer::from_gguf(&gguf).context("tokenizer")?;
    let template = ChatTemplate::from_gguf(&gguf, &tokenizer).context("chat template")?;
    let mut model = Model::from_gguf(gguf).with_context(|| path.display().to_string())?;
    attach_gpu(
        &mut model,
        PlacementLimits {
            max_layers: gpu.max_layers(),
        },
    );
    Ok(Loaded {
        model,
        tokenizer,
        template,
        load_time: t0.elapsed(),
    })
}

#[cfg(feature = "vulkan")]
fn attach_gpu(model: &mut Model, limits: PlacementLimits) {
    let verbose = std::env::var("FISH_GPU_VERBOSE").is_ok_and(|v| v == "1");
    match fish_span::open_global() {
        Ok(backend) => model.place_on(backend, limits),
        Err(reason) if verbose => eprintln!("fish: running on the CPU: {reason}"),
        Err(_) => {}
    }
}

#[cfg(not(feature = "vulkan"))]
fn attach_gpu(_model: &mut Model, _limits: PlacementLimits) {}
