//! Flags shared by several commands.

use clap::Args;
use fish_core::sampling::SamplerConfig;

#[derive(Args, Clone, Debug)]
pub struct ThreadArgs {
    /// Threads for the CPU kernels (default: one per core).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
}

impl ThreadArgs {
    pub fn resolve(&self) -> usize {
        self.threads
            .filter(|&t| t > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the K most likely tokens (0: off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P (1.0: off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens below P times the top probability (0.0: off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalise tokens seen in the last --repeat-last-n tokens (1.0: off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed (default: random).
    #[arg(long = "seed")]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn config(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed.unwrap_or_else(rand::random),
        }
    }
}

#[derive(Args, Clone, Debug)]
pub struct GpuArgs {
    /// Layers to offload to the GPU (default: as many as fit; also FISH_GPU_LAYERS).
    #[arg(long = "n-gpu-layers", visible_alias = "ngl")]
    pub n_gpu_layers: Option<usize>,
    /// Re-quantise the device copy of the weights: 1 every weight to FQ3, 2 Q5_K, Q6_K and
    /// Q8_0 to Q4_K, 3 Q4_K to FQ3 and Q6_K to Q4_K (default: FISH_GPU_REQUANT, else 0).
    #[arg(long = "requant", value_parser = clap::value_parser!(u8).range(0..=3))]
    pub requant: Option<u8>,
}

// A CPU-only build (no `vulkan` feature) accepts the flags but places nothing.
#[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
impl GpuArgs {
    /// The layer cap: the flag, else FISH_GPU_LAYERS, else none.
    pub fn max_layers(&self) -> Option<usize> {
        self.n_gpu_layers.or_else(|| {
            std::env::var("FISH_GPU_LAYERS")
                .ok()
                .and_then(|v| v.trim().parse().ok())
        })
    }

    /// The re-quantisation level: the flag, else FISH_GPU_REQUANT, else 0.
    pub fn requant_level(&self) -> u8 {
        self.requant.unwrap_or_else(|| {
            std::env::var("FISH_GPU_REQUANT")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .filter(|&level| level <= 3)
                .unwrap_or(0)
        })
    }
}

/// Speculative decoding: a draft model and how many tokens it proposes per round.
#[derive(Args, Clone, Debug)]
pub struct SpecArgs {
    /// A draft model for speculative decoding (it must share the model's vocabulary).
    #[arg(long = "model-draft", visible_alias = "md")]
    pub model_draft: Option<std::path::PathBuf>,
    /// Fixed number of tokens drafted per round (default 3).
    #[arg(
        long = "spec-draft-n",
        conflicts_with = "spec_draft_adaptive",
        requires = "model_draft"
    )]
    pub spec_draft_n: Option<usize>,
    /// Size each draft from the measured acceptance (between --spec-draft-n-min and -max).
    #[arg(long = "spec-draft-adaptive", requires = "model_draft")]
    pub spec_draft_adaptive: bool,
    /// Floor of the adaptive draft length.
    #[arg(
        long = "spec-draft-n-min",
        default_value_t = 1,
        requires = "spec_draft_adaptive"
    )]
    pub spec_draft_n_min: usize,
    /// Ceiling of the adaptive draft length.
    #[arg(
        long = "spec-draft-n-max",
        default_value_t = fish_core::spec_controller::DEFAULT_N_MAX,
        requires = "spec_draft_adaptive"
    )]
    pub spec_draft_n_max: usize,
}

impl SpecArgs {
    pub fn policy(&self) -> fish_core::spec_controller::DraftLength {
        use fish_core::spec_controller::DraftLength;
        if self.spec_draft_adaptive {
            DraftLength::Adaptive {
                n_min: self.spec_draft_n_min,
                n_max: self.spec_draft_n_max,
            }
        } else {
            DraftLength::Fixed(self.spec_draft_n.unwrap_or(3))
        }
    }
}
