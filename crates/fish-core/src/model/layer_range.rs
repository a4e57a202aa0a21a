//! A range of layers applied to a residual stream the caller holds: the
//! reference a device span is checked against, and the way an engine runs
//! the layers of a span on the CPU when the span is not available.
//!
//! The arithmetic is the same as the full forward's (matmuls on the device
//! for placed layers, as stage 1 does; norms, RoPE and attention on the CPU).

use std::ops::Range;

use fish_gguf::Gguf;
use fish_quant::{dot_type, matmul_quantized, quantize_acts};

use super::attention::{attend, AttentionShape};
use super::config::Activation;
use super::gpu::GpuPlacement;
use super::kv_cache::KvCache;
use super::ops::{self, RopeAngles};
use super::swiglu::swiglu_row;
use super::weights::Matrix;
use super::Model;
use crate::backend::TensorId;
use crate::error::{EngineError, Result};

/// The token embeddings (scaled where the architecture does): the residual
/// stream before layer 0, n_tok x n_embd.
pub fn embed_tokens(model: &Model, tokens: &[u32]) -> Result<Vec<f32>> {
    let (g, cfg) = (&*model.gguf, &model.cfg);
    let m = &model.weights.token_embd;
    let data = g.tensor_data(&m.info);
    let row_bytes = data.len() / m.n_out;
    let mut x = vec![0f32; tokens.len() * cfg.n_embd];
    for (row, &tok) in x.chunks_exact_mut(cfg.n_embd).zip(tokens) {
        if tok as usize >= m.n_out {
            return Err(EngineError::BadToken {
                id: tok,
                n_vocab: m.n_out,
            });
        }
        fish_quant::dequant_row(
            m.info.ty,
            &data[tok as usize * row_bytes..][..row_bytes],
            row,
        )?;
        if cfg.embd_scale != 1.0 {
            row.iter_mut().for_each(|v| *v *= cfg.embd_scale);
        }
    }
    Ok(x)
}

/// Runs `layers` on `x` (n_tok x n_embd) for tokens at positions `pos0..`,
/// storing their keys and values in `cache` (which must hold the earlier
/// positions of these layers).
pub fn forward_layers(
    model: &Model,
    cache: &mut KvCache,
    x: &mut [f32],
    pos0: usize,
    layers: Range<usize>,
) -> Result<()> {
    let cfg = &model.cfg;
    let n_tok = x.len() / cfg.n_embd;
    if n_tok == 0 {
        return Err(EngineError::EmptyInput);
    }
    if x.len() != n_tok * cfg.n_embd || layers.end > cfg.n_layer {
        return Err(EngineError::BadHyperParameter(format!(
            "{} values for rows of {} through layers {layers:?} of {}",
            x.len(),
            cfg.n_embd,
            cfg.n_layer
        )));
    }
    cache.check_append(pos0, n_tok)?;
    let angles = |base: f32| -> Vec<RopeAngles> {
        (0..n_tok)
            .map(|t| RopeAngles::new(pos0 + t, cfg.n_rot, base, cfg.rope_freq_scale))
            .collect()
    };
    let global = angles(cfg.rope_base);
    let swa = angles(cfg.rope_base_swa);
    for il in layers {
        let a = if cfg.is_swa_layer(il) { &swa } else { &global };
        layer(model, cache, x, n_tok, pos0, il, a)?;
    }
    cache.set_len(pos0 + n_tok);
    Ok(())
}

fn layer(
    model: &Model,
    cache: &mut KvCache,
    x: &mut [f32],
    n_tok: usize,
    pos0: usize,
    il: usize,
    angles: &[RopeAngles],
) -> Result<()> {
    let (g, cfg, gpu) = (&*model.gguf, &model.cfg, model.gpu.as_ref());
    let lw = &model.weights.layers[il];
    let on_gpu = gpu.and_then(|p| p.layer(il));
    let mut xn = vec![0f32; x.len()];

    ops::rms_norm_into(x, &lw.attn_norm, cfg.rms_eps, &mut xn);
    let qkv = project(
        g,
        gpu,
        on_gpu.map(|l| &l.qkv[..]),
        &[&lw.wq, &lw.wk, &lw.wv],
        &xn,
        n_tok,
    )?;
    let [mut q, mut k, mut v]: [Vec<f32>; 3] = qkv.try_into().expect("three projections");
    for (y, b) in [(&mut q, &lw.bq), (&mut k, &lw.bk), (&mut v, &lw.bv)] {
        if let Some(b) = b {
            ops::add_bias_rows(y, b);
        }
    }
    if let Some(qn) = &lw.q_norm {
        ops::rms_norm_rows(&mut q, qn, cfg.rms_eps);
    }
    if let Some(kn) = &lw.k_norm {
        ops::rms_norm_rows(&mut k, kn, cfg.rms_eps);
    }
    let (qd, kd, vd) = (cfg.q_dim(), cfg.k_dim(), cfg.v_dim());
    for t in 0..n_tok {
        ops::rope_heads(
            &mut q[t * qd..][..qd],
            cfg.head_dim,
            cfg.rope_style,
            &angles[t],
        );
        ops::rope_heads(
            &mut k[t * kd..][..kd],
            cfg.head_dim,
            cfg.rope_style,
            &angles[t],
        );
        cache.store(il, pos0 + t, &k[t * kd..][..kd], &v[t * vd..][..vd]);
    }
    let shape = AttentionShape {
        n_head: cfg.n_head,
        n_head_kv: cfg.n_head_kv,
        head_dim: cfg.head_dim,
        head_dim_v: cfg.head_dim_v,
        scale: cfg.attn_scale,
        window: if cfg.is_swa_layer(il) {
            cfg.sliding_window
        } else {
            0
        },
    };
    let mut attn = vec![0f32; n_tok * cfg.n_head * cfg.head_dim_v];
    attend(&shape, cache, il, &q, pos0, &mut attn);
    let mut o = project_one(g, gpu, on_gpu.map(|l| l.wo), &lw.wo, &attn, n_tok)?;
    if let Some(pn) = &lw.post_attn_norm {
        ops::rms_norm_rows(&mut o, pn, cfg.rms_eps);
    }
    ops::add_in_place(x, &o);

    ops::rms_norm_into(x, &lw.ffn_norm, cfg.rms_eps, &mut xn);
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
            for (g_row, u_row) in gate.chunks_exact_mut(n_ff).zip(up.chunks_exact(n_ff)) {
                swiglu_row(g_row, u_row);
            }
        }
        Activation::GeGlu => {
            for (gv, &uv) in gate.iter_mut().zip(&up) {
                *gv = ops::gelu(*gv) * uv;
            }
        }
    }
    let mut d = project_one(g, gpu, on_gpu.map(|l| l.down), &lw.w_down, &gate, n_tok)?;
    if let Some(pn) = &lw.post_ffn_norm {
        ops::rms_norm_rows(&mut d, pn, cfg.rms_eps);
    }
    ops::add_in_place(x, &d);
    Ok(())
}

/// Projections through several matrices: one device submit when placed,
/// else the CPU with the activations quantised once per dot-product format.
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
        if !matches!(&acts, Some((t, _)) if *t == dt) {
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
