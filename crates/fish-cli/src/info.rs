//! `fish-cli info`: metadata (long arrays summarised), tensor table and per-type totals.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use fish_gguf::{Gguf, ValueRef};
use serde_json::{json, Value as Json};

/// Arrays longer than this are shown as their first few elements and a count.
const ARRAY_PREVIEW: usize = 8;

#[derive(Args)]
pub struct InfoArgs {
    /// Path to a GGUF file.
    model: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &InfoArgs) -> Result<()> {
    let gguf = Gguf::open(&args.model).with_context(|| format!("{}", args.model.display()))?;
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&to_json(&gguf))?)
    } else {
        print_text(&mut out, &gguf)
    };
    match written {
        // A closed pipe (`info | head`) is the reader's choice, not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

fn value_json(v: ValueRef<'_>) -> Json {
    match v {
        ValueRef::String(s) => json!(s),
        ValueRef::Bool(b) => json!(b),
        ValueRef::F32(x) => json!(x),
        ValueRef::F64(x) => json!(x),
        ValueRef::Array(a) if a.len() > ARRAY_PREVIEW => json!({
            "type": format!("array[{}]", a.elem_type()),
            "len": a.len(),
            "head": a.iter().take(ARRAY_PREVIEW).map(value_json).collect::<Vec<_>>(),
        }),
        ValueRef::Array(a) => Json::Array(a.iter().map(value_json).collect()),
        other => other
            .as_i64()
            .map(|i| json!(i))
            .or_else(|| other.as_u64().map(|u| json!(u)))
            .unwrap_or(Json::Null),
    }
}

fn value_text(v: ValueRef<'_>) -> String {
    match v {
        ValueRef::String(s) => {
            let mut t: String = s.chars().take(120).collect();
            if t.len() < s.len() {
                t.push_str(&format!("... ({} bytes)", s.len()));
            }
            format!("{t:?}")
        }
        ValueRef::Array(a) => {
            let head: Vec<String> = a.iter().take(ARRAY_PREVIEW).map(value_text).collect();
            let more = if a.len() > ARRAY_PREVIEW { ", ..." } else { "" };
            format!(
                "[{}{}] ({} x {})",
                head.join(", "),
                more,
                a.len(),
                a.elem_type()
            )
        }
        other => value_json(other).to_string(),
    }
}

/// Per-type tensor count and bytes, ordered by type name.
fn totals(gguf: &Gguf) -> BTreeMap<&'static str, (usize, u64)> {
    let mut totals = BTreeMap::new();
    for t in gguf.tensors() {
        let e = totals.entry(t.ty.name()).or_insert((0usize, 0u64));
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    totals
}

fn to_json(gguf: &Gguf) -> Json {
    let metadata: serde_json::Map<String, Json> = gguf
        .metadata()
        .map(|(k, v)| (k.to_owned(), value_json(v)))
        .collect();
    let tensors: Vec<Json> = gguf
        .tensors()
        .iter()
        .map(|t| json!({"name": t.name, "type": t.ty.name(), "shape": t.dims, "bytes": t.n_bytes}))
        .collect();
    let totals: serde_json::Map<String, Json> = totals(gguf)
        .into_iter()
        .map(|(ty, (n, bytes))| (ty.to_owned(), json!({"tensors": n, "bytes": bytes})))
        .collect();
    json!({
        "version": gguf.version(),
        "alignment": gguf.alignment(),
        "file_bytes": gguf.file_len(),
        "metadata": metadata,
        "tensors": tensors,
        "totals": totals,
    })
}

fn print_text(out: &mut impl Write, gguf: &Gguf) -> std::io::Result<()> {
    writeln!(
        out,
        "GGUF v{}, {} bytes, alignment {}",
        gguf.version(),
        gguf.file_len(),
        gguf.alignment()
    )?;
    writeln!(out, "\nmetadata ({} keys):", gguf.keys().count())?;
    for (k, v) in gguf.metadata() {
        writeln!(out, "  {k:<44} {}", value_text(v))?;
    }
    writeln!(out, "\ntensors ({}):", gguf.tensors().len())?;
    writeln!(
        out,
        "  {:<40} {:<6} {:<24} {:>12}",
        "name", "type", "shape", "bytes"
    )?;
    for t in gguf.tensors() {
        let shape = format!("{:?}", t.dims);
        writeln!(
            out,
            "  {:<40} {:<6} {:<24} {:>12}",
            t.name,
            t.ty.name(),
            shape,
            t.n_bytes
        )?;
    }
    writeln!(out, "\ntotals:")?;
    let mut all = 0u64;
    for (ty, (n, bytes)) in totals(gguf) {
        writeln!(
            out,
            "  {ty:<6} {n:>5} tensors {:>10.2} MB",
            bytes as f64 / 1e6
        )?;
        all += bytes;
    }
    writeln!(
        out,
        "  all    {:>5} tensors {:>10.2} MB",
        gguf.tensors().len(),
        all as f64 / 1e6
    )?;
    Ok(())
}
