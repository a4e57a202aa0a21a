//! The CPU KV cache: f16 keys and values per layer, as llama.cpp's default
//! cache type. A layer's storage is allocated on its first store, so layers
//! that run in a device span never take CPU memory.

use std::sync::atomic::{AtomicU64, Ordering};

use half::f16;

use crate::error::{EngineError, Result};

/// Source of cache identities (0 is never handed out).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub struct KvCache {
    /// Unique per cache: tells whose positions a device span holds.
    id: u64,
    n_ctx: usize,
    k_dim: usize,
    v_dim: usize,
    /// Per layer: `n_ctx * k_dim` keys, position-major (empty until first stored).
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    /// Positions `< len` hold valid entries.
    len: usize,
}

impl KvCache {
    /// A cache for `n_ctx` positions of `n_layer` layers; memory is taken per
    /// layer when that layer first stores.
    pub fn new(n_layer: usize, n_ctx: usize, k_dim: usize, v_dim: usize) -> KvCache {
        KvCache {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            n_ctx,
            k_dim,
            v_dim,
            k: vec![Vec::new(); n_layer],
            v: vec![Vec::new(); n_layer],
            len: 0,
        }
    }

    pub fn id(&self) -> u64 {
        self.id
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
        if self.k[il].is_empty() {
            self.k[il] = vec![f16::ZERO; self.n_ctx * self.k_dim];
            self.v[il] = vec![f16::ZERO; self.n_ctx * self.v_dim];
        }
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

    /// Bytes held by the cache (allocated layers only).
    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|l| l.len() * 2).sum()
    }
}
