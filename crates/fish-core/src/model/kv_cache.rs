//! The CPU KV cache: f16 keys and values per layer, as llama.cpp's default
//! cache type, sized for the context at creation.

use half::f16;

use crate::error::{EngineError, Result};

pub struct KvCache {
    n_ctx: usize,
    k_dim: usize,
    v_dim: usize,
    /// Per layer: `n_ctx * k_dim` keys, position-major.
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    /// Positions `< len` hold valid entries.
    len: usize,
}

impl KvCache {
    /// `layers` lists which layers keep a CPU cache (the others get none).
    pub fn new(n_layer: usize, n_ctx: usize, k_dim: usize, v_dim: usize) -> KvCache {
        KvCache {
            n_ctx,
            k_dim,
            v_dim,
            k: (0..n_layer)
                .map(|_| vec![f16::ZERO; n_ctx * k_dim])
                .collect(),
            v: (0..n_layer)
                .map(|_| vec![f16::ZERO; n_ctx * v_dim])
                .collect(),
            len: 0,
        }
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps positions `< n` (drops rejected draft tokens or a changed prompt suffix).
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
    }

    /// Checks that `n_tok` tokens can be written at `pos0` without a gap.
    pub fn check_append(&self, pos0: usize, n_tok: usize) -> Result<()> {
        if pos0 > self.len || pos0 + n_tok > self.n_ctx {
            return Err(EngineError::ContextFull {
                pos: pos0,
                n_tok,
                n_ctx: self.n_ctx,
            });
        }
        Ok(())
    }

    /// Stores one token's keys and values at `pos` of layer `il`.
    pub fn store(&mut self, il: usize, pos: usize, k: &[f32], v: &[f32]) {
        let kd = &mut self.k[il][pos * self.k_dim..(pos + 1) * self.k_dim];
        for (d, &s) in kd.iter_mut().zip(k) {
            *d = f16::from_f32(s);
        }
        let vd = &mut self.v[il][pos * self.v_dim..(pos + 1) * self.v_dim];
        for (d, &s) in vd.iter_mut().zip(v) {
            *d = f16::from_f32(s);
        }
    }

    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.n_ctx);
    }

    pub fn keys(&self, il: usize) -> &[f16] {
        &self.k[il]
    }

    pub fn values(&self, il: usize) -> &[f16] {
        &self.v[il]
    }

    pub fn k_dim(&self) -> usize {
        self.k_dim
    }

    pub fn v_dim(&self) -> usize {
        self.v_dim
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        self.k.len() * self.n_ctx * (self.k_dim + self.v_dim) * 2
    }
}
