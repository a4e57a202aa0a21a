//! The model's tensors, located and shape-checked at load. Matrices stay in
//! the memory map; only small vectors (norms, biases) are copied out.

use fish_gguf::{Gguf, TensorInfo};
use fish_quant::Weights;

use super::config::{Arch, ModelConfig};
use crate::error::{EngineError, Result};

/// A weight matrix of `n_out` rows of `n_in` values, still in the file.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub info: TensorInfo,
    pub n_in: usize,
    pub n_out: usize,
}

impl Matrix {
    /// The matrix as a kernel argument, borrowing its bytes from the map.
    pub fn weights<'a>(&self, g: &'a Gguf) -> Weights<'a> {
        Weights {
            ty: self.info.ty,
            data: g.tensor_data(&self.info),
            n_in: self.n_in,
            n_out: self.n_out,
        }
    }
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub wo: Matrix,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Matrix,
    pub w_up: Matrix,
    pub w_down: Matrix,
    pub post_ffn_norm: Option<Vec<f32>>,
}

pub struct ModelWeights {
    pub token_embd: Matrix,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// The output projection; `token_embd` itself when the model ties them.
    pub output: Matrix,
}

struct Loader<'a> {
    g: &'a Gguf,
}

impl<'a> Loader<'a> {
    fn info(&self, name: &str) -> Result<&'a TensorInfo> {
        self.g
            .tensor(name)
            .ok_or_else(|| EngineError::MissingTensor(name.to_owned()))
    }

    fn check_shape(&self, t: &TensorInfo, expected: &[u64]) -> Result<()> {
        if t.dims != expected {
            return Err(EngineError::TensorShape {
                name: t.name.clone(),
                found: t.dims.clone(),
                expected: expected.to_vec(),
            });
        }
        Ok(())
    }

    fn matrix(&self, name: &str, n_in: usize, n_out: usize) -> Result<Matrix> {
        let t = self.info(name)?;
        self.check_shape(t, &[n_in as u64, n_out as u64])?;
        if !fish_quant::is_supported(t.ty) {
            return Err(EngineError::UnsupportedTensorType {
                name: name.to_owned(),
                ty: t.ty,
            });
        }
        Ok(Matrix {
            info: t.clone(),
            n_in,
            n_out,
        })
    }

    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        let t = self.info(name)?;
        self.check_shape(t, &[n as u64])?;
        let mut v = vec![0.0f32; n];
        fish_quant::dequant_row(t.ty, self.g.tensor_data(t), &mut v)?;
        Ok(v)
    }

    fn opt_vector(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>> {
        if self.g.tensor(name).is_none() {
            return Ok(None);
        }
        self.vector(name, n).map(Some)
    }
}

impl ModelWeights {
    pub fn load(g: &Gguf, cfg: &ModelConfig) -> Result<ModelWeights> {
        let l = Loader { g };
        let token_embd = l.matrix("token_embd.weight", cfg.n_embd, cfg.n_vocab)?;
        let output = if g.tensor("output.weight").is_some() {
            l.matrix("output.weight", cfg.n_embd, cfg.n_vocab)?
        } else {
            token_embd.clone()
        };
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for il in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}");
            let need_qk_norm = matches!(cfg.arch, Arch::Qwen3 | Arch::Gemma3);
            let need_biases = cfg.arch == Arch::Qwen2;
            let layer = LayerWeights {
                attn_norm: l.vector(&n("attn_norm.weight"), cfg.n_embd)?,
                wq: l.matrix(&n("attn_q.weight"), cfg.n_embd, cfg.q_dim())?,
                wk: l.matrix(&n("attn_k.weight"), cfg.n_embd, cfg.k_dim())?,
                wv: l.matrix(&n("attn_v.weight"), cfg.n_embd, cfg.v_dim())?,
                bq: if need_biases {
                    Some(l.vector(&n("attn_q.bias"), cfg.q_dim())?)
                } else {
                    l.opt_vector(&n("attn_q.bias"), cfg.q_dim())?
                },
                bk: if need_biases {
                    Some(l.vector(&n("attn_k.bias"), cfg.k_dim())?)
                } else {
                    l.opt_vector(&n("attn_k.bias"), cfg.k_dim())?
                },
                bv: if need_biases {
                    Some(l.vector(&n("attn_v.bias"), cfg.v_dim())?)
                } else {
                    l.opt_vector(&n("attn_v.bias"), cfg.v_dim())?
                },
                q_norm: if need_qk_norm {
                    Some(l.vector(&n("attn_q_norm.weight"), cfg.head_dim)?)
                } else {
                    None
                },
                k_norm: if need_qk_norm {
                    Some(l.vector(&n("attn_k_norm.weight"), cfg.head_dim)?)
                } else {
                    None
                },
                wo: l.matrix(
                    &n("attn_output.weight"),
                    cfg.n_head * cfg.head_dim_v,
                    cfg.n_embd,
                )?,
                post_attn_norm: if cfg.arch == Arch::Gemma3 {
                    Some(l.vector(&n("post_attention_norm.weight"), cfg.n_embd)?)
                } else {
                    None
                },
                ffn_norm: l.vector(&n("ffn_norm.weight"), cfg.n_embd)?,
                w_gate: l.matrix(&n("ffn_gate.weight"), cfg.n_embd, cfg.n_ff)?,
                w_up: l.matrix(&n("ffn_up.weight"), cfg.n_embd, cfg.n_ff)?,
                w_down: l.matrix(&n("ffn_down.weight"), cfg.n_ff, cfg.n_embd)?,
                post_ffn_norm: if cfg.arch == Arch::Gemma3 {
                    Some(l.vector(&n("post_ffw_norm.weight"), cfg.n_embd)?)
                } else {
                    None
                },
            };
            layers.push(layer);
        }
        Ok(ModelWeights {
            token_embd,
            layers,
            output_norm: l.vector("output_norm.weight", cfg.n_embd)?,
            output,
        })
    }
}
