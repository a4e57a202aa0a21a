//! `fish-cli quantize IN OUT TYPE`: rewrites a model's matrices in another
//! weight type or mix, as llama-quantize does. Each row is decoded to f32 and
//! encoded again on the rayon pool; the output depends only on the input
//! bytes and TYPE, not on the thread count.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use fish_gguf::{GgmlType, Gguf, GgufWriter, TensorInfo, TensorSpec, Value};
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;

use crate::mix::{Mix, Role, MIX_NAMES};

#[derive(Args)]
pub struct QuantizeArgs {
    /// Input GGUF model.
    input: PathBuf,
    /// Output GGUF path.
    output: PathBuf,
    /// Weight type or mix.
    #[arg(help = format!("Weight type or mix: {MIX_NAMES}"))]
    ty: String,
}

/// llama.cpp's quantisation version, written as `general.quantization_version`.
const QUANTIZATION_VERSION: u32 = 2;

/// Output bytes converted per parallel batch: bounds memory for large tensors.
const BATCH_BYTES: usize = 16 << 20;

pub fn run(args: &QuantizeArgs) -> Result<()> {
    let mix = Mix::parse(&args.ty)?;
    let t0 = Instant::now();
    let gguf = Gguf::open(&args.input).with_context(|| args.input.display().to_string())?;
    let plan = plan(&gguf, mix)?;

    let mut w = GgufWriter::new();
    for (key, value) in gguf.metadata() {
        w.kv(key, value.to_owned_value());
    }
    w.kv(
        "general.quantization_version",
        Value::U32(QUANTIZATION_VERSION),
    );
    w.kv("general.file_type", Value::U32(mix.file_type()));
    for (t, &ty) in gguf.tensors().iter().zip(&plan) {
        w.tensor(TensorSpec::new(t.name.clone(), &t.dims, ty));
    }

    let total: u64 = gguf.tensors().iter().map(|t| t.n_elements).sum();
    let pb = progress_bar(total);
    let file = File::create(&args.output).with_context(|| args.output.display().to_string())?;
    w.write(BufWriter::with_capacity(1 << 22, file), |i, spec, out| {
        let t = &gguf.tensors()[i];
        pb.set_message(t.name.clone());
        convert(&gguf, t, spec.ty, out)?;
        pb.inc(t.n_elements);
        Ok(())
    })
    .with_context(|| args.output.display().to_string())?;
    pb.finish_and_clear();

    eprintln!(
        "wrote {} ({}) in {:.2} s: {}",
        args.output.display(),
        args.ty,
        t0.elapsed().as_secs_f64(),
        type_counts(&plan)
    );
    Ok(())
}

/// The output type of every tensor, in file order.
fn plan(gguf: &Gguf, mix: Mix) -> Result<Vec<GgmlType>> {
    let tensors = gguf.tensors();
    let tied_output = !tensors.iter().any(|t| t.name == "output.weight");
    let n_attn_v = tensors.iter().filter(|t| is_kind(t, "attn_v")).count();
    let n_ffn_down = gguf.block_count().context("block count")? as usize;
    tensors
        .iter()
        .map(|t| {
            if !is_quantizable(t) {
                return Ok(t.ty);
            }
            let (rank, n_of_kind) = if is_kind(t, "attn_v") {
                (rank_of(tensors, t, "attn_v"), n_attn_v)
            } else {
                (rank_of(tensors, t, "ffn_down"), n_ffn_down)
            };
            let ty = mix.tensor_type(&Role {
                name: &t.name,
                row_len: t.row_len() as usize,
                rank,
                n_of_kind,
                tied_output,
            });
            anyhow::ensure!(
                fish_quant::is_supported(t.ty),
                "tensor {}: cannot decode {}",
                t.name,
                t.ty
            );
            Ok(ty)
        })
        .collect()
}

/// Matrices whose name says they are weights; norms, 1-D tensors and
/// expert routers keep their type (llama-quantize leaves them too).
fn is_quantizable(t: &TensorInfo) -> bool {
    t.dims.len() >= 2
        && t.name.ends_with("weight")
        && !t.name.contains("_norm.weight")
        && !t.name.contains("ffn_gate_inp.weight")
        && t.name != "position_embd.weight"
        && t.name != "token_types.weight"
}

fn is_kind(t: &TensorInfo, kind: &str) -> bool {
    match kind {
        "attn_v" => t.name.contains("attn_v.weight") || t.name.contains("attn_qkv.weight"),
        _ => t.name.contains(kind),
    }
}

/// The layer of a `blk.N.` tensor; others sort before every layer.
fn layer_of(name: &str) -> Option<u64> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// How many tensors of `kind` come before `t` in llama-quantize's order
/// (by layer, then by name); for one such tensor per layer, its layer.
fn rank_of(tensors: &[TensorInfo], t: &TensorInfo, kind: &str) -> usize {
    let key = |x: &TensorInfo| (layer_of(&x.name), x.name.clone());
    let own = key(t);
    tensors
        .iter()
        .filter(|x| is_kind(x, kind) && key(x) < own)
        .count()
}

/// Writes tensor `t` in type `ty`: a copy when the type is unchanged,
/// otherwise every row decoded and encoded again.
fn convert(gguf: &Gguf, t: &TensorInfo, ty: GgmlType, out: &mut dyn Write) -> std::io::Result<()> {
    let src = gguf.tensor_data(t);
    if ty == t.ty {
        return out.write_all(src);
    }
    let row_len = t.row_len() as usize;
    let src_row = fish_quant::row_bytes(t.ty, row_len).map_err(std::io::Error::other)?;
    let dst_row = fish_quant::row_bytes(ty, row_len).map_err(std::io::Error::other)?;
    let rows_per_batch = (BATCH_BYTES / dst_row.max(1)).max(1);
    let mut buf = Vec::new();
    for batch in src.chunks(rows_per_batch * src_row) {
        buf.resize(batch.len() / src_row * dst_row, 0);
        buf.par_chunks_mut(dst_row)
            .zip(batch.par_chunks(src_row))
            .try_for_each_init(
                || vec![0f32; row_len],
                |values, (dst, src)| {
                    fish_quant::dequant_row(t.ty, src, values)?;
                    fish_quant::quantize_row(ty, values, dst)
                },
            )
            .map_err(|e| std::io::Error::other(format!("tensor {}: {e}", t.name)))?;
        out.write_all(&buf)?;
    }
    Ok(())
}

fn progress_bar(total: u64) -> ProgressBar {
    // indicatif draws nothing when stderr is not a terminal.
    let pb = ProgressBar::new(total);
    let style = ProgressStyle::with_template("quantizing [{bar:40}] {percent}% {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    pb
}

/// "Q8_0 x1, Q5_0 x150, F32 x61": how many tensors of each type were written.
fn type_counts(plan: &[GgmlType]) -> String {
    let mut counts: Vec<(GgmlType, usize)> = Vec::new();
    for &ty in plan {
        match counts.iter_mut().find(|(t, _)| *t == ty) {
            Some((_, n)) => *n += 1,
            None => counts.push((ty, 1)),
        }
    }
    counts
        .iter()
        .map(|(t, n)| format!("{t} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
