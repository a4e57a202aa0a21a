//! Throughput of the CPU kernels: dequantisation and matmul (decode, one
//! token) in GB/s of weights per format and thread count, prefill matmul,
//! and re-quantisation in ns per weight.
//!
//! `cargo bench -p fish-quant --bench kernels`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fish_quant::{dequant_row, matmul_batch, quantize_row, row_bytes, GgmlType, Weights};
use std::hint::black_box;
use std::time::Duration;

const TYPES: [GgmlType; 13] = [
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q5_0,
    GgmlType::Q4_0,
    GgmlType::Q5_1,
    GgmlType::Q5_K,
    GgmlType::Q3_K,
    GgmlType::Q2_K,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

fn data(n: usize) -> Vec<f32> {
    let mut s = 12345u32;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn quantized(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; row_bytes(ty, x.len()).unwrap()];
    quantize_row(ty, x, &mut q).unwrap();
    q
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

/// Decode: one token against a matrix far larger than the caches, so the
/// figure is the weight streaming rate.
fn matvec(c: &mut Criterion) {
    let n_in = 2048;
    let src = data(n_in * 256);
    let x = data(n_in);
    let mut g = c.benchmark_group("matvec");
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(20);
    for ty in TYPES {
        let bytes_per_row = row_bytes(ty, n_in).unwrap();
        // About 48 MB of weights whatever the format.
        let n_out = (48 << 20) / bytes_per_row;
        // Quantise 256 distinct rows once and repeat them: the bytes streamed
        // are what matters, and quantising 48 MB with the k-quant search is slow.
        let distinct = quantized(ty, &src[..n_in * 256]);
        let w_bytes: Vec<u8> = distinct
            .iter()
            .copied()
            .cycle()
            .take(bytes_per_row * n_out)
            .collect();
        let w = Weights::new(ty, &w_bytes, n_in, n_out).unwrap();
        let mut y = vec![0f32; n_out];
        g.throughput(Throughput::Bytes(w_bytes.len() as u64));
        for threads in [1, 2] {
            let p = pool(threads);
            g.bench_function(BenchmarkId::new(ty.name(), format!("{threads}t")), |b| {
                p.install(|| b.iter(|| matmul_batch(w, black_box(&x), 1, &mut y).unwrap()))
            });
        }
    }
    g.finish();
}

/// Prefill: 64 tokens against a SmolLM2-sized projection (576 -> 1536, or
/// 1536 -> 576 for the k-quants, whose rows are whole 256-value blocks).
/// Throughput in weight-token products per second.
fn prefill(c: &mut Criterion) {
    let n_tok = 64;
    let mut g = c.benchmark_group("prefill64");
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(20);
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_0,
        GgmlType::Q4_0,
    ] {
        let (n_in, n_out) = if ty.block_size() == 256 {
            (1536, 576)
        } else {
            (576, 1536)
        };
        let src = data(n_in * n_out);
        let x = data(n_in * n_tok);
        let w_bytes = quantized(ty, &src);
        let w = Weights::new(ty, &w_bytes, n_in, n_out).unwrap();
        let mut y = vec![0f32; n_out * n_tok];
        g.throughput(Throughput::Elements((n_in * n_out * n_tok) as u64));
        for threads in [1, 2] {
            let p = pool(threads);
            g.bench_function(BenchmarkId::new(ty.name(), format!("{threads}t")), |b| {
                p.install(|| b.iter(|| matmul_batch(w, black_box(&x), n_tok, &mut y).unwrap()))
            });
        }
    }
    g.finish();
}

/// Dequantisation of one 1 MiB-ish row set, single thread, GB/s of weights.
fn dequant(c: &mut Criterion) {
    let n = 256 * 1024;
    let src = data(n);
    let mut out = vec![0f32; n];
    let mut g = c.benchmark_group("dequant");
    g.measurement_time(Duration::from_secs(1))
        .warm_up_time(Duration::from_millis(300))
        .sample_size(20);
    for ty in TYPES {
        let q = quantized(ty, &src);
        g.throughput(Throughput::Bytes(q.len() as u64));
        g.bench_function(ty.name(), |b| {
            b.iter(|| dequant_row(ty, black_box(&q), &mut out).unwrap())
        });
    }
    g.finish();
}

/// Re-quantisation of Q4_K rows to FQ3 and Q6_K rows to Q4_K, ns per weight.
fn requant(c: &mut Criterion) {
    use fish_quant::requant::{requantize, requantize_weighted, RequantTarget};
    let (n_in, n_rows) = (1536, 64);
    let src = data(n_in * n_rows);
    let mut g = c.benchmark_group("requant");
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300))
        .sample_size(10);
    // Importance as activation energy looks: most columns small, a few
    // heavy ones.
    let importance: Vec<f32> = data(n_in).iter().map(|v| (8.0 * v).exp()).collect();
    for (ty, target) in [
        (GgmlType::Q4_K, RequantTarget::Fq3),
        (GgmlType::Q6_K, RequantTarget::Q4K),
    ] {
        let q = quantized(ty, &src);
        g.throughput(Throughput::Elements((n_in * n_rows) as u64));
        for threads in [1, 2] {
            let p = pool(threads);
            g.bench_function(
                BenchmarkId::new(format!("{ty}->{target:?}"), format!("{threads}t")),
                |b| {
                    p.install(|| {
                        b.iter(|| requantize(ty, black_box(&q), n_in, n_rows, target).unwrap())
                    })
                },
            );
            g.bench_function(
                BenchmarkId::new(format!("weighted {ty}->{target:?}"), format!("{threads}t")),
                |b| {
                    p.install(|| {
                        b.iter(|| {
                            requantize_weighted(
                                ty,
                                black_box(&q),
                                n_in,
                                n_rows,
                                target,
                                &importance,
                            )
                            .unwrap()
                        })
                    })
                },
            );
        }
    }
    g.finish();
}

criterion_group!(benches, matvec, prefill, dequant, requant);
criterion_main!(benches);
