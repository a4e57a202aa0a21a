//! The CPU forward pass: all tokens of a batch go through each matmul together.

use std::ops::Range;

use fish_gguf::Gguf;
use fish_quant::{dot_type, matmul_quantized, quantize_acts};
use rayon::prelude::*;

use super::attention::{attend, AttentionShape};
use super::config::{Activation, ModelConfig};
use super::gpu::GpuPlacement;
use super::kv_cache::KvCache;
use super::ops::{self, RopeAngles};
use super::swiglu::swiglu_row;
use super::weights::{Matrix, ModelWeights};
use super::Model;
use crate::backend::TensorId;
use crate::error::{EngineError, Result};

/// Batches of at least this many tokens spread their per-token RoPE and
/// SwiGLU rows over the pool (each row computed as on one thread).
const PARALLEL_ROWS_MIN_TOKENS: usize = 16;

/// Which positions of a batch need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFor {
    /// Only the last token (generation).
    Last,
    /// Every token (perplexity, speculative verification).
    All,
}

/// Projections of one input through several matrices: on the device when
/// they are placed there (one submit), else on the CPU with the activations
/// quantised once per dot-product format.
fn project(
    g: &Gguf,
    gpu: Option<&GpuPlacement>,
    ids: Option<&[TensorId]>,
    mats: &[&Matrix],
    x: &[f32],
    n_tok: usize,
) -> Result<Vec<Vec<f32>>> {
    if let (Some(gpu), Some(ids)) = (gpu, ids) {
        match gpu.backend.matmul_group(ids, x, n_tok) {
            Ok(ys) => return Ok(ys),
            Err(e) => gpu.mark_failed(&e),
        }
    }
    let mut out = Vec::with_capacity(mats.len());
    let mut acts = None;
    for m in mats {
        let dt = dot_type(m.info.ty);
        let reuse = matches!(&acts, Some((t, _)) if *t == dt);
        if !reuse {
            acts = Some((dt, quantize_acts(dt, x, n_tok, m.n_in)?));
        }
        let (_, a) = acts.as_ref().expect("set above");
        let mut y = vec![0f32; n_tok * m.n_out];
        matmul_quantized(m.weights(g), a, &mut y)?;
        out.push(y);
    }
    Ok(out)
}

fn project_one(
    g: &Gguf,
    gpu: Option<&GpuPlacement>,
    id: Option<TensorId>,
    m: &Matrix,
    x: &[f32],
    n_tok: usize,
) -> Result<Vec<f32>> {
    let ids = id.map(|i| [i]);
    let mut ys = project(g, gpu, ids.as_ref().map(|a| &a[..]), &[m], x, n_tok)?;
    Ok(ys.pop().expect("one matrix"))
}

/// Runs `tokens` at positions `pos0..`, appending their keys/values to the
/// cache, and returns logits (n_vocab per requested token).
pub fn forward(
    model: &Model,
    cache: &mut KvCache,
    tokens: &[u32],
    pos0: usize,
    logits_for: LogitsFor,
) -> Result<Vec<f32>> {
    let n_tok = tokens.len();
    if n_tok == 0 {
        return Err(EngineError::EmptyInput);
    }
    cache.check_append(pos0, n_tok)?;
    let n_embd = model.cfg.n_embd;
    let mut x = embed(&model.gguf, &model.cfg, &model.weights, tokens)?;
    let positions: Vec<usize> = (pos0..pos0 + n_tok).collect();
    run_layers(
        model,
        &mut x,
        &positions,
        &mut OneSequence { cache, pos0 },
        0..model.cfg.n_layer,
    )?;
    cache.set_len(pos0 + n_tok);

    let rows = match logits_for {
        LogitsFor::Last => &x[(n_tok - 1) * n_embd..],
        LogitsFor::All => &x[..],
    };
    let logits = output_logits(model, rows);
    super::residual_buffer::recycle(x);
    logits
}

/// Where a batch's keys and values go and where its queries attend: one
/// cache for consecutive positions ([`forward`]) or one cache per row
/// (batched decode of independent sequences).
pub(super) trait KvSite {
    /// Stores row `t`'s keys and values in layer `il`.
    fn store(&mut self, il: usize, t: usize, k: &[f32], v: &[f32]);
    /// Attention of every row's query (`q`: n_tok rows) into `out`.
    fn attend(&self, shape: &AttentionShape, il: usize, q: &[f32], out: &mut [f32]);
}

/// One sequence: row `t` sits at position `pos0 + t` of `cache`.
pub(super) struct OneSequence<'a> {
    pub cache: &'a mut KvCache,
    pub pos0: usize,
}

impl KvSite for OneSequence<'_> {
    fn store(&mut self, il: usize, t: usize, k: &[f32], v: &[f32]) {
        self.cache.store(il, self.pos0 + t, k, v);
    }

    fn attend(&self, shape: &AttentionShape, il: usize, q: &[f32], out: &mut [f32]) {
        attend(shape, self.cache, il, q, self.pos0, out);
    }
}

/// Runs `layers` over the hidden states `x` (one row per entry of
/// `positions`, the RoPE position of that row), with keys and values kept by `kv`.
pub(super) fn run_layers(
    model: &Model,
    x: &mut [f32],
    positions: &[usize],
    kv: &mut dyn KvSite,
    layers: Range<usize>,
) -> Result<()> {
    run_layers_observed(model, x, positions, kv, layers, &mut |_, _| {})
}

/// Sees the input rows of each group of projections (matrices sharing one
/// input) before they are multiplied; calibration records their statistics.
pub(super) type InputObserver<'a> = dyn FnMut(&[&Matrix], &[f32]) + 'a;

/// [`run_layers`], showing every projection input to `observe`.
pub(super) fn run_layers_observed(
    model: &Model,
    x: &mut [f32],
    positions: &[usize],
    kv: &mut dyn KvSite,
    layers: Range<usize>,
    observe: &mut InputObserver<'_>,
) -> Result<()> {
    let (g, cfg, w, gpu) = (&*model.gguf, &model.cfg, &model.weights, model.gpu.as_ref());
    let n_tok = positions.len();
    let n_embd = cfg.n_embd;
    // A span holding every layer leaves none here: the RoPE angles below
    // (two libm calls per pair and position) cost a 512-token llama-8b
    // prompt 1.5-5.6 ms on the H200's host for nothing.
    if layers.is_empty() {
        return Ok(());
    }

    let rope = |base: f32| -> Vec<RopeAngles> {
        positions
            .iter()
            .map(|&p| RopeAngles::new(p, cfg.n_rot, base, cfg.rope_freq_scale))
            .collect()
    };
    let angles_global = rope(cfg.rope_base);
    let angles_swa = if cfg.sliding_window > 0 {
        rope(cfg.rope_base_swa)
    } else {
        Vec::new()
    };

    let mut xn = vec![0f32; n_tok * n_embd];
    for (il, lw) in w
        .layers
        .iter()
        .enumerate()
        .take(layers.end)
        .skip(layers.start)
    {
        let swa = cfg.is_swa_layer(il);
        // Attention block.
        ops::rms_norm_into(x, &lw.attn_norm, cfg.rms_eps, &mut xn);
        let on_gpu = gpu.and_then(|p| p.layer(il));
        observe(&[&lw.wq, &lw.wk, &lw.wv], &xn);
        let qkv = project(
            g,
            gpu,
            on_gpu.map(|l| &l.qkv[..]),
            &[&lw.wq, &lw.wk, &lw.wv],
            &xn,
            n_tok,
        )?;
        let [mut q, mut k, mut v]: [Vec<f32>; 3] = qkv.try_into().expect("three projections");
        if let Some(b) = &lw.bq {
            ops::add_bias_rows(&mut q, b);
        }
        if let Some(b) = &lw.bk {
            ops::add_bias_rows(&mut k, b);
        }
        if let Some(b) = &lw.bv {
            ops::add_bias_rows(&mut v, b);
        }
        if let Some(qn) = &lw.q_norm {
            ops::rms_norm_rows(&mut q, qn, cfg.rms_eps);
        }
        if let Some(kn) = &lw.k_norm {
            ops::rms_norm_rows(&mut k, kn, cfg.rms_eps);
        }
        let angles = if swa { &angles_swa } else { &angles_global };
        let rope_rows = |rows: &mut [f32], dim: usize| {
            let rope_one = |(row, a): (&mut [f32], &RopeAngles)| {
                ops::rope_heads(row, cfg.head_dim, cfg.rope_style, a)
            };
            if n_tok >= PARALLEL_ROWS_MIN_TOKENS {
                rows.par_chunks_mut(dim).zip(angles).for_each(rope_one);
            } else {
                rows.chunks_mut(dim).zip(angles).for_each(rope_one);
            }
        };
        rope_rows(&mut q, cfg.q_dim());
        rope_rows(&mut k, cfg.k_dim());
        for t in 0..n_tok {
            kv.store(
                il,
                t,
                &k[t * cfg.k_dim()..][..cfg.k_dim()],
                &v[t * cfg.v_dim()..][..cfg.v_dim()],
            );
        }
        let shape = AttentionShape {
            n_head: cfg.n_head,
            n_head_kv: cfg.n_head_kv,
            head_dim: cfg.head_dim,
            head_dim_v: cfg.head_dim_v,
            scale: cfg.attn_scale,
            window: if swa { cfg.sliding_window } else { 0 },
        };
        let mut attn = vec![0f32; n_tok * cfg.n_head * cfg.head_dim_v];
        kv.attend(&shape, il, &q, &mut attn);
        observe(&[&lw.wo], &attn);
        let mut o = project_one(g, gpu, on_gpu.map(|l| l.wo), &lw.wo, &attn, n_tok)?;
        if let Some(pn) = &lw.post_attn_norm {
            ops::rms_norm_rows(&mut o, pn, cfg.rms_eps);
        }
        ops::add_in_place(x, &o);

        // Feed-forward block.
        ops::rms_norm_into(x, &lw.ffn_norm, cfg.rms_eps, &mut xn);
        let on_gpu = gpu.and_then(|p| p.layer(il));
        observe(&[&lw.w_gate, &lw.w_up], &xn);
        let gu = project(
            g,
            gpu,
            on_gpu.map(|l| &l.gate_up[..]),
            &[&lw.w_gate, &lw.w_up],
            &xn,
            n_tok,
        )?;
        let [mut gate, up]: [Vec<f32>; 2] = gu.try_into().expect("two projections");
        match cfg.activation {
            Activation::SwiGlu => {
                let n_ff = lw.w_gate.n_out;
                if n_tok >= PARALLEL_ROWS_MIN_TOKENS {
                    gate.par_chunks_exact_mut(n_ff)
                        .zip(up.par_chunks_exact(n_ff))
                        .for_each(|(g_row, u_row)| swiglu_row(g_row, u_row));
                } else {
                    for (g_row, u_row) in gate.chunks_exact_mut(n_ff).zip(up.chunks_exact(n_ff)) {
                        swiglu_row(g_row, u_row);
                    }
                }
            }
            Activation::GeGlu => {
                for (gv, &uv) in gate.iter_mut().zip(&up) {
                    *gv = ops::gelu(*gv) * uv;
                }
            }
        }
        observe(&[&lw.w_down], &gate);
        let mut d = project_one(g, gpu, on_gpu.map(|l| l.down), &lw.w_down, &gate, n_tok)?;
        if let Some(pn) = &lw.post_ffn_norm {
            ops::rms_norm_rows(&mut d, pn, cfg.rms_eps);
        }
        ops::add_in_place(x, &d);
    }
    Ok(())
}

/// Final norm and output projection of hidden-state `rows` (n_vocab logits each).
pub(super) fn output_logits(model: &Model, rows: &[f32]) -> Result<Vec<f32>> {
    let (g, cfg, w, gpu) = (&*model.gguf, &model.cfg, &model.weights, model.gpu.as_ref());
    let n_rows = rows.len() / cfg.n_embd;
    let mut h = rows.to_vec();
    ops::rms_norm_rows(&mut h, &w.output_norm, cfg.rms_eps);
    project_one(g, gpu, gpu.and_then(|p| p.output()), &w.output, &h, n_rows)
}

/// Token embeddings (rows of token_embd), scaled for architectures that do so.
/// Prompts decode their rows on the pool: a 512-token prompt of an 8B-class
/// model is 2M values from rows scattered over the file, whose first touch
/// also faults their pages in (~6 ms on one thread of the H200's host, 7%
/// of a span prefill).
pub(super) fn embed(
    g: &Gguf,
    cfg: &ModelConfig,
    w: &ModelWeights,
    tokens: &[u32],
) -> Result<Vec<f32>> {
    /// Fewest tokens worth handing to the pool (a decode step is one).
    const PARALLEL_TOKENS: usize = 8;
    let n_embd = cfg.n_embd;
    let m = &w.token_embd;
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= m.n_out) {
        return Err(EngineError::BadToken {
            id: bad,
            n_vocab: m.n_out,
        });
    }
    let data = g.tensor_data(&m.info);
    let row_bytes = data.len() / m.n_out;
    let embed_row = |(row, &tok): (&mut [f32], &u32)| -> Result<()> {
        let src = &data[tok as usize * row_bytes..][..row_bytes];
        fish_quant::dequant_row(m.info.ty, src, row)?;
        if cfg.embd_scale != 1.0 {
            row.iter_mut().for_each(|v| *v *= cfg.embd_scale);
        }
        Ok(())
    };
    // Every value is written below, so a recycled buffer's stale values
    // never show (residual_buffer.rs).
    let mut x = super::residual_buffer::take(tokens.len() * n_embd);
    if tokens.len() >= PARALLEL_TOKENS {
        x.par_chunks_exact_mut(n_embd)
            .zip(tokens.par_iter())
            .try_for_each(embed_row)?;
    } else {
        x.chunks_exact_mut(n_embd)
            .zip(tokens)
            .try_for_each(embed_row)?;
    }
    Ok(x)
}
