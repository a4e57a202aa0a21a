//! `fish-cli synth`: a llama-shaped model with random weights, quantised by
//! fish-quant, with a working byte-level BPE tokenizer, so benchmarks run on
//! machines that cannot receive a multi-GB model.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use fish_gguf::{GgmlType, GgufWriter, TensorSpec, Value};
use rayon::prelude::*;

use crate::mix::{fit_row, Mix, Role};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Shape {
    #[value(name = "smollm-135m")]
    Smollm135m,
    #[value(name = "llama-1b")]
    Llama1b,
    #[value(name = "llama-8b")]
    Llama8b,
    /// Two layers of 256-value rows, so that every matrix holds whole
    /// K-quant super-blocks: tests of the K-quant kernels in spans on slow
    /// devices (lavapipe).
    #[value(name = "tiny")]
    Tiny,
    /// Two layers of 2048-value rows and a narrow feed-forward: matrices
    /// whose rows outrun one round of the decode kernels' loads, for span
    /// tests on slow devices.
    #[value(name = "tiny-wide")]
    TinyWide,
}

struct Dims {
    n_layer: usize,
    n_embd: usize,
    n_ff: usize,
    n_head: usize,
    n_head_kv: usize,
    n_vocab: usize,
    rope_base: f32,
    pre: &'static str,
}

impl Shape {
    fn dims(self) -> Dims {
        match self {
            Shape::Smollm135m => Dims {
                n_layer: 30,
                n_embd: 576,
                n_ff: 1536,
                n_head: 9,
                n_head_kv: 3,
                n_vocab: 49152,
                rope_base: 100_000.0,
                pre: "smollm",
            },
            Shape::Llama1b => Dims {
                n_layer: 16,
                n_embd: 2048,
                n_ff: 8192,
                n_head: 32,
                n_head_kv: 8,
                n_vocab: 128_256,
                rope_base: 500_000.0,
                pre: "llama-bpe",
            },
            Shape::Tiny => Dims {
                n_layer: 2,
                n_embd: 256,
                n_ff: 768,
                n_head: 4,
                n_head_kv: 2,
                n_vocab: 512,
                rope_base: 10_000.0,
                pre: "llama-bpe",
            },
            Shape::TinyWide => Dims {
                n_layer: 2,
                n_embd: 2048,
                n_ff: 256,
                n_head: 16,
                n_head_kv: 4,
                n_vocab: 512,
                rope_base: 10_000.0,
                pre: "llama-bpe",
            },
            Shape::Llama8b => Dims {
                n_layer: 32,
                n_embd: 4096,
                n_ff: 14336,
                n_head: 32,
                n_head_kv: 8,
                n_vocab: 128_256,
                rope_base: 500_000.0,
                pre: "llama-bpe",
            },
        }
    }
}

#[derive(Args)]
pub struct SynthArgs {
    /// The model shape.
    #[arg(long)]
    shape: Shape,
    /// Weight type or mix: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k,
    /// q6_k, q4_k_s, q4_k_m, q5_k_m.
    #[arg(long = "type")]
    ty: String,
    /// Seed for the random weights.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output GGUF path.
    out: PathBuf,
}

/// The type of tensor `name` (layer `il` of `n_layer`). A plain type applies
/// to every matrix, the output too; mixes follow llama-quantize's rules.
fn type_for(mix: Mix, name: &str, n_in: usize, il: Option<usize>, n_layer: usize) -> GgmlType {
    match mix {
        Mix::Plain(t) => fit_row(t, n_in),
        _ => mix.tensor_type(&Role {
            name,
            row_len: n_in,
            rank: il.unwrap_or(0),
            n_of_kind: n_layer,
            tied_output: false,
        }),
    }
}

/// GPT-2's byte-to-character map: printable bytes stand for themselves,
/// the rest are shifted to code points from U+0100.
fn byte_chars() -> Vec<char> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256u32;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                let c = char::from_u32(next).unwrap_or('?');
                next += 1;
                c
            }
        })
        .collect()
}

fn tokenizer_kvs(w: &mut GgufWriter, d: &Dims) {
    let mut tokens: Vec<String> = vec![
        "<|begin_of_text|>".into(),
        "<|end_of_text|>".into(),
        "<|eot_id|>".into(),
    ];
    let mut types = vec![3i32, 3, 3];
    tokens.extend(byte_chars().into_iter().map(String::from));
    types.extend(std::iter::repeat_n(1, 256));
    while tokens.len() < d.n_vocab {
        types.push(4);
        tokens.push(format!("<|reserved_{}|>", tokens.len()));
    }
    w.kv("tokenizer.ggml.model", "gpt2");
    w.kv("tokenizer.ggml.pre", d.pre);
    w.kv("tokenizer.ggml.tokens", Value::string_array(tokens));
    w.kv("tokenizer.ggml.token_type", Value::i32_array(types));
    w.kv(
        "tokenizer.ggml.merges",
        Value::string_array(Vec::<String>::new()),
    );
    w.kv("tokenizer.ggml.bos_token_id", Value::U32(0));
    w.kv("tokenizer.ggml.eos_token_id", Value::U32(1));
    w.kv("tokenizer.ggml.eot_token_id", Value::U32(2));
    w.kv("tokenizer.ggml.add_bos_token", true);
    w.kv(
        "tokenizer.chat_template",
        "{% for m in messages %}<|begin_of_text|>{{ m['role'] }}\n{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|begin_of_text|>assistant\n{% endif %}",
    );
}

/// A small, fast generator; quality is irrelevant, reproducibility is not.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-a, a).
    fn uniform(&mut self, a: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
    }
}

/// Distinct random rows quantised per tensor; the other rows repeat them.
/// Quantising every row of an 8B shape costs minutes on 16 cores, while
/// throughput does not depend on how many rows differ.
const POOL_ROWS: usize = 256;

/// Writes the rows of a random matrix, quantised: a pool of `POOL_ROWS`
/// random rows (quantised in parallel), then every row taken from the pool
/// in a scrambled order.
fn write_random(
    out: &mut dyn Write,
    spec: &TensorSpec,
    seed: u64,
    std: f32,
) -> std::io::Result<()> {
    let n_in = spec.dims[0] as usize;
    let n_rows: usize = spec.dims[1..].iter().product::<u64>() as usize;
    let row_bytes = spec.ty.bytes_for(n_in as u64).unwrap_or(0) as usize;
    // Uniform with this half-width has standard deviation `std`.
    let a = std * 3f32.sqrt();
    let n_pool = POOL_ROWS.min(n_rows);
    let mut pool = vec![0u8; n_pool * row_bytes];
    pool.par_chunks_mut(row_bytes)
        .enumerate()
        .try_for_each(|(i, dst)| {
            let mut rng = SplitMix(seed ^ (i as u64).wrapping_mul(0x2545_F491_4F6C_DD1D));
            let row: Vec<f32> = (0..n_in).map(|_| rng.uniform(a)).collect();
            fish_quant::quantize_row(spec.ty, &row, dst).map_err(std::io::Error::other)
        })?;
    let mut rng = SplitMix(seed);
    let mut buf = Vec::with_capacity(n_pool * row_bytes);
    for start in (0..n_rows).step_by(n_pool) {
        buf.clear();
        for _ in start..(start + n_pool).min(n_rows) {
            let pick = (rng.next() % n_pool as u64) as usize;
            buf.extend_from_slice(&pool[pick * row_bytes..(pick + 1) * row_bytes]);
        }
        out.write_all(&buf)?;
    }
    Ok(())
}

pub fn run(args: &SynthArgs) -> Result<()> {
    let mix = Mix::parse(&args.ty)?;
    let d = args.shape.dims();
    let mut w = GgufWriter::new();
    w.kv("general.architecture", "llama");
    w.kv(
        "general.name",
        format!("fish synth {:?} {}", args.shape, args.ty),
    );
    w.kv("llama.block_count", Value::U32(d.n_layer as u32));
    w.kv("llama.context_length", Value::U32(8192));
    w.kv("llama.embedding_length", Value::U32(d.n_embd as u32));
    w.kv("llama.feed_forward_length", Value::U32(d.n_ff as u32));
    w.kv("llama.attention.head_count", Value::U32(d.n_head as u32));
    w.kv(
        "llama.attention.head_count_kv",
        Value::U32(d.n_head_kv as u32),
    );
    w.kv("llama.rope.freq_base", Value::F32(d.rope_base));
    w.kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    w.kv("llama.vocab_size", Value::U32(d.n_vocab as u32));
    tokenizer_kvs(&mut w, &d);

    let head_dim = d.n_embd / d.n_head;
    let kv_dim = d.n_head_kv * head_dim;
    let mut add = |name: String, dims: &[usize], il: Option<usize>| {
        let ty = if dims.len() == 1 {
            GgmlType::F32
        } else {
            type_for(mix, &name, dims[0], il, d.n_layer)
        };
        let dims: Vec<u64> = dims.iter().map(|&x| x as u64).collect();
        w.tensor(TensorSpec::new(name, &dims, ty));
    };
    add("token_embd.weight".into(), &[d.n_embd, d.n_vocab], None);
    for il in 0..d.n_layer {
        let n = |s: &str| format!("blk.{il}.{s}");
        add(n("attn_norm.weight"), &[d.n_embd], Some(il));
        add(n("attn_q.weight"), &[d.n_embd, d.n_embd], Some(il));
        add(n("attn_k.weight"), &[d.n_embd, kv_dim], Some(il));
        add(n("attn_v.weight"), &[d.n_embd, kv_dim], Some(il));
        add(n("attn_output.weight"), &[d.n_embd, d.n_embd], Some(il));
        add(n("ffn_norm.weight"), &[d.n_embd], Some(il));
        add(n("ffn_gate.weight"), &[d.n_embd, d.n_ff], Some(il));
        add(n("ffn_up.weight"), &[d.n_embd, d.n_ff], Some(il));
        add(n("ffn_down.weight"), &[d.n_ff, d.n_embd], Some(il));
    }
    add("output_norm.weight".into(), &[d.n_embd], None);
    add("output.weight".into(), &[d.n_embd, d.n_vocab], None);

    let file = File::create(&args.out).with_context(|| args.out.display().to_string())?;
    let seed = args.seed;
    w.write(BufWriter::with_capacity(1 << 22, file), |i, spec, out| {
        if spec.dims.len() == 1 {
            // Norm weights of one keep activations at unit scale.
            let ones: Vec<u8> = std::iter::repeat_n(1f32.to_le_bytes(), spec.dims[0] as usize)
                .flatten()
                .collect();
            return out.write_all(&ones);
        }
        write_random(
            out,
            spec,
            seed.wrapping_mul(1_000_003).wrapping_add(i as u64),
            0.02,
        )
    })
    .with_context(|| args.out.display().to_string())?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}
