//! Opening a model for the commands: weights, tokenizer, chat template, load time.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fish_core::chat::ChatTemplate;
use fish_core::model::Model;
use fish_core::tokenizer::Tokenizer;
use fish_gguf::Gguf;
use indicatif::{ProgressBar, ProgressStyle};

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
    let mut loaded = load_cpu(path)?;
    attach_gpu(&mut loaded.model, gpu);
    loaded.load_time = t0.elapsed();
    Ok(loaded)
}

/// Loads a model without touching the GPU.
pub fn load_cpu(path: &Path) -> Result<Loaded> {
    let t0 = Instant::now();
    let gguf = Arc::new(Gguf::open(path).with_context(|| path.display().to_string())?);
    let tokenizer = Tokenizer::from_gguf(&gguf).context("tokenizer")?;
    let template = ChatTemplate::from_gguf(&gguf, &tokenizer).context("chat template")?;
    warm_pages(&gguf);
    let model = Model::from_gguf(gguf).with_context(|| path.display().to_string())?;
    Ok(Loaded {
        model,
        tokenizer,
        template,
        load_time: t0.elapsed(),
    })
}

/// Places what fits on the GPU, unless FISH_GPU disables it or no device
/// opens (then the model stays on the CPU).
#[cfg(feature = "vulkan")]
pub fn attach_gpu(model: &mut Model, gpu: &GpuArgs) {
    let verbose = std::env::var("FISH_GPU_VERBOSE").is_ok_and(|v| v == "1");
    let limits = fish_core::model::PlacementLimits {
        max_layers: gpu.max_layers(),
    };
    match fish_span::open_global() {
        Ok(backend) => {
            let level = gpu.requant_level();
            backend.set_requant(fish_span::RequantMode::from_level(level).unwrap_or_default());
            if imatrix_wanted(level) {
                backend.set_requant_importance(calibration_importance(model, verbose));
            }
            // Re-quantisation happens inside each upload, so the layer bar is its bar.
            let what = match level {
                0 => "uploading".to_owned(),
                n => format!("re-quantising (mode {n}) and uploading"),
            };
            let pb = bar(model.cfg.n_layer as u64, &what, Unit::Layers);
            model.place_on_with_progress(backend, limits, &mut |p| {
                pb.set_length(p.total as u64);
                pb.set_position(p.done as u64);
            });
            pb.finish_and_clear();
        }
        Err(reason) if verbose => eprintln!("fish: running on the CPU: {reason}"),
        Err(_) => {}
    }
}

/// Whether re-quantisation at `level` is weighed by calibration activation
/// energy: `FISH_GPU_REQUANT_IMATRIX=1|0` forces it on or off; by default
/// only mode 1 (everything to FQ3), where it lifts top-1 over the 95% bar
/// that the plain fit misses, while modes 2 and 3 clear it with the plain
/// fit at half the time per weight (docs/QUANT.md).
#[cfg(feature = "vulkan")]
fn imatrix_wanted(level: u8) -> bool {
    match std::env::var("FISH_GPU_REQUANT_IMATRIX").as_deref() {
        _ if level == 0 => false,
        Ok("1") => true,
        Ok("0") => false,
        _ => level == 1,
    }
}

/// Input energy of every matrix from a CPU run of the built-in calibration
/// text; None (plain fit) when the run fails.
#[cfg(feature = "vulkan")]
fn calibration_importance(
    model: &Model,
    verbose: bool,
) -> Option<Arc<fish_core::model::calibration::InputImportance>> {
    use fish_core::model::calibration::{calibrate, CALIBRATION_TEXT};
    use fish_core::tokenizer::EncodeOptions;
    let t0 = Instant::now();
    let result = Tokenizer::from_gguf(&model.gguf)
        .map_err(|e| e.to_string())
        .and_then(|tok| {
            let tokens = tok.encode(CALIBRATION_TEXT, EncodeOptions::PROMPT);
            calibrate(model, &tokens)
                .map(|imp| (imp, tokens.len()))
                .map_err(|e| e.to_string())
        });
    match result {
        Ok((imp, n)) => {
            if verbose {
                eprintln!(
                    "fish: calibration: {n} tokens, {} tensors, {:.1} s",
                    imp.by_tensor.len(),
                    t0.elapsed().as_secs_f64()
                );
            }
            Some(Arc::new(imp))
        }
        Err(e) => {
            eprintln!("fish: calibration failed ({e}); plain re-quantisation fit");
            None
        }
    }
}

#[cfg(not(feature = "vulkan"))]
pub fn attach_gpu(_model: &mut Model, _gpu: &GpuArgs) {}

/// Files at least this large get a progress bar while their pages are read in.
const WARM_BAR_BYTES: u64 = 512 << 20;

/// What a progress bar counts.
enum Unit {
    Bytes,
    // Only GPU placement counts layers.
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
    Layers,
}

fn bar(len: u64, what: &str, unit: Unit) -> ProgressBar {
    // indicatif draws nothing when stderr is not a terminal.
    let pb = ProgressBar::new(len);
    let template = match unit {
        Unit::Bytes => "{msg} [{bar:40}] {binary_bytes}/{binary_total_bytes}",
        Unit::Layers => "{msg} [{bar:40}] {pos}/{len} layers",
    };
    let style =
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    pb.set_message(what.to_owned());
    pb
}

/// Reads a large file's tensor pages in once, with a progress bar, so the
/// first forward pass does not stall on page faults. Small files skip this:
/// their pages come in quickly on first use.
fn warm_pages(gguf: &Gguf) {
    let total: u64 = gguf.tensors().iter().map(|t| t.n_bytes).sum();
    if total < WARM_BAR_BYTES || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return;
    }
    let pb = bar(total, "loading", Unit::Bytes);
    let mut sum = 0u8;
    for t in gguf.tensors() {
        // One byte per page faults the whole page in.
        sum = gguf
            .tensor_data(t)
            .iter()
            .step_by(4096)
            .fold(sum, |a, &b| a.wrapping_add(b));
        pb.inc(t.n_bytes);
    }
    std::hint::black_box(sum);
    pb.finish_and_clear();
}
