//! The decode-layer kernel (shaders/persistent_decode_layer.comp) against a
//! CPU reference of the same llama layers: every vector of every phase
//! (q/k/v, attention, x after wo, SiLU(gate) * up, x after down) and the
//! key and value it stores, over three layers (two weight copies) with 37
//! positions already cached.
//! One workgroup, so that it runs where workgroups run one after another;
//! its blocks then cover every row of every phase. The same step as one
//! dispatch per phase (no grid-wide barrier) runs on three workgroups,
//! which checks how the blocks are dealt out. On a device that keeps
//! many workgroups resident, FISH_TEST_PERSISTENT_GROUPS=N checks N of them
//! meeting at the grid-wide barriers as well. (Not on lavapipe: llvmpipe
//! ends an invocation whose loop runs past 65535 iterations, so a poller
//! whose wait outlasts that dies silently, with its later arrivals and the
//! failure flag; with two workgroups there 27 of the 30 arrivals were
//! counted and layer 0's attention read unfinished inputs.)

mod common;

use common::{gpu_or_skip, random_values};
use fish_gguf::GgmlType;
use fish_vk::{DecodeRun, DecodeShape};
use half::f16;

fn f16r(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// Rows of `n_in` random values scaled by 1 / sqrt(n_in), as Q4_K bytes and
/// decoded.
fn matrix(rows: usize, n_in: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let scale = 1.0 / (n_in as f32).sqrt();
    let values: Vec<f32> = random_values(rows * n_in, seed)
        .iter()
        .map(|v| v * scale)
        .collect();
    let row = n_in / 256 * 144;
    let mut bytes = vec![0u8; rows * row];
    let mut decoded = vec![0f32; rows * n_in];
    for ((src, dst), deq) in values
        .chunks_exact(n_in)
        .zip(bytes.chunks_exact_mut(row))
        .zip(decoded.chunks_exact_mut(n_in))
    {
        fish_quant::quantize_row(GgmlType::Q4_K, src, dst).expect("quantise");
        fish_quant::dequant_row(GgmlType::Q4_K, dst, deq).expect("dequant");
    }
    (bytes, decoded)
}

/// `w` (rows of x.len() values) times x, in f64.
fn matvec(w: &[f32], x: &[f32]) -> Vec<f64> {
    w.chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum())
        .collect()
}

struct Layer {
    mats: Vec<Vec<f32>>,
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
}

fn rope(v: &mut [f32], pos: usize, s: &DecodeShape) {
    let d = s.head_dim;
    for i in 0..d / 2 {
        let (a, b) = if s.neox {
            (i, i + d / 2)
        } else {
            (2 * i, 2 * i + 1)
        };
        let theta = pos as f64 * (s.rope_base as f64).powf(-2.0 * i as f64 / d as f64);
        let (sin, cos) = theta.sin_cos();
        let (x0, x1) = (v[a] as f64, v[b] as f64);
        v[a] = (x0 * cos - x1 * sin) as f32;
        v[b] = (x0 * sin + x1 * cos) as f32;
    }
}

/// x * g rounded to f16 (the staging), and the norm's factor.
fn normed(x: &[f32], g: &[f32], eps: f32) -> (Vec<f32>, f64) {
    let mean = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
    let xn = x.iter().zip(g).map(|(&a, &b)| f16r(a * b)).collect();
    (xn, 1.0 / (mean + eps as f64).sqrt())
}

#[test]
fn the_decode_layer_kernel_matches_a_cpu_reference() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut groups = vec![1];
    if let Some(n) = std::env::var("FISH_TEST_PERSISTENT_GROUPS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        groups.push(n);
    }
    for g in groups {
        for (neox, l1_inputs) in [(false, false), (true, false), (false, true)] {
            check_decode_layers(gpu, neox, l1_inputs, false, g);
        }
    }
    // One dispatch per phase needs no grid-wide barrier, so three
    // workgroups share every phase's blocks here too.
    check_decode_layers(gpu, false, false, true, 3);
    assert_eq!(gpu.validation_messages(), 0);
}

fn check_decode_layers(
    gpu: &fish_vk::Gpu,
    neox: bool,
    l1_inputs: bool,
    per_phase: bool,
    groups: u32,
) {
    let shape = DecodeShape {
        n_embd: 1024,
        n_ff: 2048,
        n_head: 8,
        n_kv_heads: 2,
        head_dim: 128,
        neox,
        rope_base: 10000.0,
        eps: 1e-5,
    };
    let run = DecodeRun {
        per_phase,
        l1_inputs,
        shape,
        copies: 2,
        layers: 3,
        groups,
        // Enough cached positions for several rounds of the value loads.
        pos: 37,
        kv_capacity: 40,
    };
    let (e, f, d, kvd) = (shape.n_embd, shape.n_ff, shape.head_dim, shape.kv_dim());

    // The layer copies, as the upload's bytes and decoded.
    let mut bytes = Vec::new();
    let mut copies = Vec::new();
    for c in 0..run.copies {
        let mut mats = Vec::new();
        for (m, &(rows, n_in)) in shape.matrices().iter().enumerate() {
            let (q, deq) = matrix(rows, n_in, (100 * c + m) as u64);
            bytes.extend_from_slice(&q);
            mats.push(deq);
        }
        let norm = |seed| -> Vec<f32> {
            random_values(e, seed)
                .iter()
                .map(|v| 1.0 + 0.5 * v)
                .collect()
        };
        let (attn_norm, ffn_norm) = (norm(200 + c as u64), norm(300 + c as u64));
        for v in attn_norm.iter().chain(&ffn_norm) {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        copies.push(Layer {
            mats,
            attn_norm,
            ffn_norm,
        });
    }
    assert_eq!(bytes.len(), run.copies * shape.copy_bytes());
    bytes.resize(bytes.len().next_multiple_of(144), 0);
    let handle = gpu
        .upload(GgmlType::Q4_K, &bytes, 256, bytes.len() / 144)
        .expect("upload");

    // The buffer: the input x, and cached keys and values before `pos`.
    let mut buffer = vec![0u32; run.buffer_words()];
    let x0 = random_values(e, 7);
    for (i, v) in x0.iter().enumerate() {
        buffer[run.slot_word(0, 0) + i] = v.to_bits();
    }
    // Per layer and position: keys and values as f32 (the f16 values).
    let mut keys = vec![vec![vec![0f32; kvd]; run.pos + 1]; run.layers];
    let mut values = keys.clone();
    for l in 0..run.layers {
        for p in 0..run.pos {
            let k = random_values(kvd, (1000 + 10 * l + p) as u64);
            let v = random_values(kvd, (2000 + 10 * l + p) as u64);
            for i in 0..kvd / 2 {
                let pack = |a: f32, b: f32| {
                    f16::from_f32(a).to_bits() as u32 | (f16::from_f32(b).to_bits() as u32) << 16
                };
                buffer[run.key_word(l, p) + i] = pack(k[2 * i], k[2 * i + 1]);
                buffer[run.value_word(l, p) + i] = pack(v[2 * i], v[2 * i + 1]);
            }
            keys[l][p] = k.iter().map(|&a| f16r(a)).collect();
            values[l][p] = v.iter().map(|&a| f16r(a)).collect();
        }
    }

    // The CPU reference, every phase's vector kept: per layer (q/k/v,
    // attention, x after wo, SiLU(gate) * up, x after down).
    let mut expected: Vec<[Vec<f32>; 5]> = Vec::new();
    let mut x = x0.clone();
    for l in 0..run.layers {
        let layer = &copies[l % run.copies];
        let (xn, scale) = normed(&x, &layer.attn_norm, shape.eps);
        let qkv: Vec<f32> = matvec(&layer.mats[0], &xn)
            .iter()
            .map(|&v| (v * scale) as f32)
            .collect();
        let mut attn = vec![0f32; e];
        let group = shape.n_head / shape.n_kv_heads;
        for j in 0..shape.n_kv_heads {
            let mut k = qkv[e + j * d..e + (j + 1) * d].to_vec();
            rope(&mut k, run.pos, &shape);
            for i in 0..d {
                keys[l][run.pos][j * d + i] = f16r(k[i]);
                values[l][run.pos][j * d + i] = f16r(qkv[e + kvd + j * d + i]);
            }
            for hq in j * group..(j + 1) * group {
                let mut q = qkv[hq * d..(hq + 1) * d].to_vec();
                rope(&mut q, run.pos, &shape);
                let scores: Vec<f64> = (0..=run.pos)
                    .map(|t| {
                        let k = &keys[l][t][j * d..(j + 1) * d];
                        q.iter()
                            .zip(k)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let sum: f64 = w.iter().sum();
                for i in 0..d {
                    let o: f64 = (0..=run.pos)
                        .map(|t| w[t] * values[l][t][j * d + i] as f64)
                        .sum();
                    attn[hq * d + i] = (o / sum) as f32;
                }
            }
        }
        let attn16: Vec<f32> = attn.iter().map(|&v| f16r(v)).collect();
        let mid: Vec<f32> = matvec(&layer.mats[1], &attn16)
            .iter()
            .zip(&x)
            .map(|(&o, &r)| (r as f64 + o) as f32)
            .collect();
        let (xn2, scale2) = normed(&mid, &layer.ffn_norm, shape.eps);
        let gu: Vec<f32> = matvec(&layer.mats[2], &xn2)
            .iter()
            .map(|&v| (v * scale2) as f32)
            .collect();
        // Gate and up rows alternate; the kernel stores the products in
        // f32 and stages them in f16.
        let prods: Vec<f32> = (0..f)
            .map(|i| {
                let g = gu[2 * i] as f64;
                (g / (1.0 + (-g).exp()) * gu[2 * i + 1] as f64) as f32
            })
            .collect();
        let h: Vec<f32> = prods.iter().map(|&v| f16r(v)).collect();
        let out: Vec<f32> = matvec(&layer.mats[3], &h)
            .iter()
            .zip(&mid)
            .map(|(&o, &r)| (r as f64 + o) as f32)
            .collect();
        expected.push([qkv, attn, mid, prods, out.clone()]);
        x = out;
    }

    let got = gpu
        .run_persistent_decode(handle, run, &buffer)
        .expect("decode-layer kernel");
    let names = [
        "q/k/v",
        "attention",
        "x after wo",
        "SiLU(gate) * up",
        "x after down",
    ];
    for (l, phases) in expected.iter().enumerate() {
        for (k, want) in phases.iter().enumerate() {
            let at = if k == 4 {
                run.slot_word(l + 1, 0)
            } else {
                run.slot_word(l, k + 1)
            };
            let peak = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, w) in want.iter().enumerate() {
                let g = f32::from_bits(got[at + i]);
                // f16 staging on both sides; sums in other orders may round
                // a staged value the other way.
                assert!(
                    (g - w).abs() <= 2e-3 * peak,
                    "groups={groups} per_phase={per_phase} neox={neox} l1={l1_inputs} layer {l} {}: [{i}] {g} against {w} (peak {peak})",
                    names[k]
                );
            }
        }
        // The key and value stored at `pos`.
        for i in 0..kvd / 2 {
            for (word, want) in [
                (run.key_word(l, run.pos) + i, &keys[l][run.pos]),
                (run.value_word(l, run.pos) + i, &values[l][run.pos]),
            ] {
                let bits = got[word];
                let pair = [
                    f16::from_bits(bits as u16).to_f32(),
                    f16::from_bits((bits >> 16) as u16).to_f32(),
                ];
                for (h, g) in pair.iter().enumerate() {
                    let w = want[2 * i + h];
                    assert!(
                        (g - w).abs() <= 2e-3 * w.abs().max(1.0),
                        "layer {l} cache [{}]: {g} against {w}",
                        2 * i + h
                    );
                }
            }
        }
    }

    // A position past the KV capacity, or a shape it does not hold, is refused.
    assert!(gpu
        .run_persistent_decode(handle, DecodeRun { pos: 40, ..run }, &buffer)
        .is_err());
    let odd = DecodeShape {
        head_dim: 96,
        ..shape
    };
    assert!(gpu
        .time_persistent_decode(handle, DecodeRun { shape: odd, ..run })
        .is_err());
    gpu.free(handle).expect("free");
}
