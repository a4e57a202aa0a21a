//! Hyper-parameters read from GGUF metadata, checked for consistency.

use fish_gguf::Gguf;

use crate::error::{EngineError, Result};

/// The model families the CPU forward pass implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM2: RoPE on adjacent pairs, SwiGLU.
    Llama,
    /// Qwen2/2.5: q/k/v biases, NeoX RoPE.
    Qwen2,
    /// Qwen3: per-head q/k RMS norm, NeoX RoPE.
    Qwen3,
    /// Gemma 3: scaled embeddings, q/k norm, GELU, post-attention/FFN norms,
    /// sliding-window layers with their own RoPE base.
    Gemma3,
}

impl Arch {
    pub fn from_name(name: &str) -> Result<Arch> {
        match name {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            "gemma3" => Ok(Arch::Gemma3),
            other => Err(EngineError::UnsupportedArch(other.to_owned())),
        }
    }
}

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Rotates (2i, 2i+1).
    Adjacent,
    /// Rotates (i, i + n_rot/2) (GPT-NeoX).
    Neox,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// silu(gate) * up
    SwiGlu,
    /// gelu_tanh(gate) * up
    GeGlu,
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Per-head width of q and k.
    pub head_dim: usize,
    /// Per-head width of v.
    pub head_dim_v: usize,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    pub rope_style: RopeStyle,
    pub rope_base: f32,
    /// RoPE base of sliding-window layers (Gemma 3 uses 10k locally).
    pub rope_base_swa: f32,
    /// Position scale (linear RoPE scaling): positions are multiplied by it.
    pub rope_freq_scale: f32,
    pub rms_eps: f32,
    pub n_ctx_train: usize,
    pub activation: Activation,
    /// Multiplier applied to token embeddings (Gemma: sqrt(n_embd)).
    pub embd_scale: f32,
    /// Scale applied to q·k.
    pub attn_scale: f32,
    /// Sliding window length for SWA layers, 0 when none.
    pub sliding_window: usize,
    /// Every `swa_period`-th layer (1-based) is global; others slide. 0: none slide.
    pub swa_period: usize,
    pub n_vocab: usize,
}

impl ModelConfig {
    pub fn from_gguf(g: &Gguf) -> Result<ModelConfig> {
        let arch = Arch::from_name(g.architecture()?)?;
        let dim = |suffix: &str| -> Result<usize> { Ok(g.arch_u64(suffix)? as usize) };
        let n_layer = dim("block_count")?;
        let n_embd = dim("embedding_length")?;
        let n_ff = dim("feed_forward_length")?;
        let n_head = dim("attention.head_count")?;
        let n_head_kv = g.head_count_kv()? as usize;
        let bad = |m: String| Err(EngineError::BadHyperParameter(m));
        if n_layer == 0 || n_embd == 0 || n_ff == 0 || n_head == 0 || n_head_kv == 0 {
            return bad(format!(
                "zero size: block_count {n_layer}, embedding_length {n_embd}, feed_forward_length {n_ff}, head_count {n_head}, head_count_kv {n_head_kv}"
            ));
        }
        // Bounds that no real model reaches keep a lying header from sizing huge buffers.
        if n_layer > 4096 || n_embd > 1 << 17 || n_ff > 1 << 20 || n_head > 4096 {
            return bad(format!(
                "implausible sizes: {n_layer} layers, {n_embd} wide, ffn {n_ff}, {n_head} heads"
            ));
        }
        if n_head % n_head_kv != 0 {
            return bad(format!(
                "head_count {n_head} is not a multiple of head_count_kv {n_head_kv}"
            ));
        }
        let head_dim = match g.arch_opt_u64("attention.key_length")? {
            Some(k) => k as usize,
            None => {
                if n_embd % n_head != 0 {
                    return bad(format!(
                        "embedding_length {n_embd} is not a multiple of head_count {n_head}"
                    ));
                }
                n_embd / n_head
            }
        };
        let head_dim_v = g
            .arch_opt_u64("attention.value_length")?
            .map_or(head_dim, |v| v as usize);
        if head_dim == 0 || head_dim > 1024 || head_dim_v == 0 || head_dim_v > 1024 {
            return bad(format!("head width {head_dim}/{head_dim_v}"));
        }
        let n_rot = g
            .arch_opt_u64("rope.dimension_count")?
            .map_or(head_dim, |v| v as usize);
        if n_rot > head_dim || n_rot % 2 != 0 {
            return bad(format!(
                "rope.dimension_count {n_rot} vs head width {head_dim}"
            ));
        }
        let rope_base = g.rope_freq_base()?.unwrap_or(10_000.0);
        let rope_freq_scale = match g.arch_opt_f32("rope.scaling.factor")? {
            Some(f) if f > 0.0 => 1.0 / f,
            _ => 1.0,
        };
        let rms_eps = g.rms_norm_eps()?.unwrap_or(1e-5);
        let n_ctx_train = g.arch_opt_u64("context_length")?.unwrap_or(4096) as usize;
        let n_vocab = match g.arch_opt_u64("vocab_size")? {
            Some(v) => v as usize,
            None => g.opt_array("tokenizer.ggml.tokens")?.map_or(0, |a| a.len()),
        };

        let mut cfg = ModelConfig {
            arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_v,
            n_rot,
            rope_style: RopeStyle::Adjacent,
            rope_base,
            rope_base_swa: rope_base,
            rope_freq_scale,
            rms_eps,
            n_ctx_train,
            activation: Activation::SwiGlu,
            embd_scale: 1.0,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            sliding_window: 0,
            swa_period: 0,
            n_vocab,
        };
        match arch {
            Arch::Llama => {}
            Arch::Qwen2 | Arch::Qwen3 => cfg.rope_style = RopeStyle::Neox,
            Arch::Gemma3 => {
                cfg.rope_style = RopeStyle::Neox;
                cfg.activation = Activation::GeGlu;
                cfg.embd_scale = (n_embd as f32).sqrt();
                // Gemma 3 local layers use a fixed 10k base; the metadata base is the global one.
                cfg.rope_base_swa = 10_000.0;
                cfg.sliding_window =
                    g.arch_opt_u64("attention.sliding_window")?.unwrap_or(0) as usize;
                cfg.swa_period = 6;
            }
        }
        Ok(cfg)
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn k_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    pub fn v_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }

    /// Whether layer `il` attends through a sliding window.
    pub fn is_swa_layer(&self, il: usize) -> bool {
        self.sliding_window > 0 && self.swa_period > 0 && !(il + 1).is_multiple_of(self.swa_period)
    }
}
