//! Every SIMD kernel against the portable dot product on the same blocks.
//!
//! Integer sums are exact in both, so the results differ only by the order
//! of f32 additions: the bound is 1e-5 of the sum of |block terms|
//! (about 2^-17, far below anything a wrong integer sum would produce).

use super::*;
use crate::acts::quantize_acts;
use crate::blocks::{ActFormat, BlockFormat};
use crate::dispatch::with_block_type;

fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5)
                * if s.is_multiple_of(7) { 6.0 } else { 1.0 }
        })
        .collect()
}

fn check<B: BlockFormat>(kernels: &[(&str, VecDot<B>)]) {
    let n = 256 * 6;
    for seed in 0..20 {
        let wf = pseudo_random(n, seed);
        let w: Vec<B> = wf
            .chunks(<B as BlockFormat>::VALUES)
            .map(B::from_float)
            .collect();
        let x = pseudo_random(n, seed + 1000);
        let acts = quantize_acts(crate::dot_type(B::TYPE), &x, 1, n).unwrap();
        let a: &[B::Act] = <B::Act as ActFormat>::view(&acts.data).unwrap();
        let reference = B::vec_dot(&w, a);
        let scale: f32 = w
            .iter()
            .zip(a.chunks(<B as BlockFormat>::VALUES / <B::Act as ActFormat>::VALUES))
            .map(|(wb, ab)| B::vec_dot(std::slice::from_ref(wb), ab).abs())
            .sum();
        for (name, k) in kernels {
            let got = k(&w, a);
            assert!(
                (got - reference).abs() <= 1e-5 * scale + 1e-7,
                "{:?} {name} seed {seed}: {got} vs portable {reference}",
                B::TYPE
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
macro_rules! check_kernel {
    ($B:ty, $kernel:ident) => {{
        let mut ks: Vec<(&str, VecDot<$B>)> = Vec::new();
        if detect() != SimdLevel::Portable {
            ks.push(("avx2", |w, a| unsafe { avx2::$kernel(w, a) }));
        }
        if detect() == SimdLevel::Avx512Vnni {
            ks.push(("avx512vnni", |w, a| unsafe { avx512::$kernel(w, a) }));
        }
        check::<$B>(&ks);
        ks.len()
    }};
}

#[test]
#[cfg(target_arch = "x86_64")]
fn simd_kernels_agree_with_portable_dot_products() {
    let mut n = 0;
    n += check_kernel!(F32Value, f32_dot);
    n += check_kernel!(F16Value, f16_dot);
    n += check_kernel!(BlockQ4_0, q4_0);
    n += check_kernel!(BlockQ4_1, q4_1);
    n += check_kernel!(BlockQ5_0, q5_0);
    n += check_kernel!(BlockQ5_1, q5_1);
    n += check_kernel!(BlockQ8_0, q8_0);
    n += check_kernel!(BlockQ4K, q4_k);
    n += check_kernel!(BlockQ5K, q5_k);
    n += check_kernel!(BlockQ6K, q6_k);
    eprintln!("checked {n} SIMD kernels at level {:?}", detect());
}

#[test]
fn best_kernels_agree_for_every_type() {
    for ty in crate::GgmlType::ALL
        .into_iter()
        .filter(|t| crate::is_supported(*t))
    {
        with_block_type!(ty, B => check::<B>(&[("best", B::best_vec_dot())]), _ => unreachable!());
    }
}

/// `matmul_quantized` (tile kernels where the type has them) against the
/// portable dot product per row and token, over shapes that leave partial
/// row groups and token groups, with 1 and 2 threads.
fn check_matmul_against_portable<B: BlockFormat>() {
    // An odd and an even number of 32-value blocks (the 512-bit tiles take
    // blocks in pairs); two and three super-blocks for the k-quants (with
    // one, the min term can cancel most of a row and the bound below,
    // relative to the block results, gets tighter than f32 rounding).
    let n_ins = if <B as BlockFormat>::VALUES > 32 {
        [512, 768]
    } else {
        [32 * 9, 32 * 10]
    };
    let shapes = [(1, 1), (3, 1), (7, 2), (13, 5), (64, 9), (301, 4)];
    for (n_in, (n_out, n_tok)) in n_ins
        .into_iter()
        .flat_map(|n_in| shapes.map(|shape| (n_in, shape)))
    {
        let wf = pseudo_random(n_in * n_out, n_out as u32);
        let w: Vec<B> = wf
            .chunks(<B as BlockFormat>::VALUES)
            .map(B::from_float)
            .collect();
        let bytes: &[u8] = bytemuck::cast_slice(&w);
        let x = pseudo_random(n_in * n_tok, 77 + n_tok as u32);
        let acts = quantize_acts(crate::dot_type(B::TYPE), &x, n_tok, n_in).unwrap();
        let a: &[B::Act] = <B::Act as ActFormat>::view(&acts.data).unwrap();
        let bpr = n_in / <B as BlockFormat>::VALUES;
        let apr = a.len() / n_tok;
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut y = vec![f32::NAN; n_out * n_tok];
            let weights = crate::Weights::new(B::TYPE, bytes, n_in, n_out).unwrap();
            pool.install(|| crate::matmul_quantized(weights, &acts, &mut y).unwrap());
            for t in 0..n_tok {
                let at = &a[t * apr..(t + 1) * apr];
                for r in 0..n_out {
                    let row = &w[r * bpr..(r + 1) * bpr];
                    let reference = B::vec_dot(row, at);
                    let scale: f32 = row
                        .iter()
                        .zip(at.chunks(apr / bpr))
                        .map(|(wb, ab)| B::vec_dot(std::slice::from_ref(wb), ab).abs())
                        .sum();
                    let got = y[t * n_out + r];
                    assert!(
                        (got - reference).abs() <= 1e-5 * scale + 1e-7,
                        "{:?} {n_out}x{n_tok} row {r} token {t} ({threads} threads): \
                         {got} vs portable {reference}",
                        B::TYPE
                    );
                }
            }
        }
    }
}

#[test]
fn matmul_tiles_agree_with_portable_dot_products() {
    for ty in crate::GgmlType::ALL
        .into_iter()
        .filter(|t| crate::is_supported(*t))
    {
        with_block_type!(ty, B => check_matmul_against_portable::<B>(), _ => unreachable!());
    }
}

/// The SIMD activation quantiser writes exactly the bytes of the portable
/// one, including zero blocks, huge and tiny magnitudes, ties, and blocks
/// with NaN or infinities (which it hands back to the portable code).
#[test]
fn simd_activation_quantisation_is_bit_identical() {
    use crate::blocks::{BlockQ8_0, BlockQ8_1};
    let mut x = pseudo_random(32 * 64, 5);
    x[..32].fill(0.0);
    for (i, v) in x[32..64].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) * 0.5; // many exact .5 ties after scaling
    }
    for v in &mut x[64..96] {
        *v *= 1e30;
    }
    for v in &mut x[96..128] {
        *v *= 1e-30;
    }
    x[130] = f32::NAN;
    x[170] = f32::INFINITY;
    x[200] = f32::NEG_INFINITY;
    x[260] = f32::MAX;
    for (dot, name) in [
        (crate::GgmlType::Q8_0, "Q8_0"),
        (crate::GgmlType::Q8_1, "Q8_1"),
    ] {
        let got = quantize_acts(dot, &x, 2, x.len() / 2).unwrap();
        let got: &[u8] = match &got.data {
            crate::acts::ActsData::Q8_0(v) => bytemuck::cast_slice(v),
            crate::acts::ActsData::Q8_1(v) => bytemuck::cast_slice(v),
            _ => unreachable!("{name} activations"),
        };
        let want: Vec<u8> = if dot == crate::GgmlType::Q8_0 {
            let mut out = vec![BlockQ8_0::default(); x.len() / 32];
            BlockQ8_0::quantize_acts(&x, &mut out);
            bytemuck::cast_slice(&out).to_vec()
        } else {
            let mut out = vec![BlockQ8_1::default(); x.len() / 32];
            BlockQ8_1::quantize_acts(&x, &mut out);
            bytemuck::cast_slice(&out).to_vec()
        };
        assert_eq!(
            got,
            &want[..],
            "{name} activations differ from the portable quantiser"
        );
    }
}

/// The SIMD Q8_K quantiser writes exactly the bytes of the portable one:
/// a zero block, exact .5 ties, huge and tiny magnitudes, a maximum whose
/// magnitude recurs with the other sign (the first one sets the scale's
/// sign), a negative maximum, and blocks with NaN or infinities.
#[test]
fn simd_q8_k_activation_quantisation_is_bit_identical() {
    use crate::blocks::BlockQ8K;
    let mut x = pseudo_random(256 * 10, 9);
    x[..256].fill(0.0);
    for (i, v) in x[256..512].iter_mut().enumerate() {
        *v = ((i % 64) as f32 - 32.0) * 0.25;
    }
    x[512..768].iter_mut().for_each(|v| *v *= 1e30);
    x[768..1024].iter_mut().for_each(|v| *v *= 1e-30);
    x[1024 + 40] = -7.0;
    x[1024 + 41] = 7.0;
    x[1280 + 100] = 9.0;
    x[1280 + 200] = -9.0;
    x[1536 + 3] = f32::NAN;
    x[1792 + 250] = f32::INFINITY;
    x[2048 + 7] = f32::MAX;
    let got = quantize_acts(crate::GgmlType::Q8_K, &x, 2, x.len() / 2).unwrap();
    let crate::acts::ActsData::Q8K(got) = &got.data else {
        panic!("Q8_K activations stored in another format");
    };
    let want: Vec<BlockQ8K> = x.chunks_exact(256).map(BlockQ8K::quantize).collect();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let (g, w): (&[u8], &[u8]) = (bytemuck::bytes_of(g), bytemuck::bytes_of(w));
        assert_eq!(g, w, "block {i} differs from the portable quantiser");
    }
    assert_eq!(got.len(), want.len());
    // The sign of the first maximum: -7 comes before 7, 9 before -9.
    assert!(want[4].d > 0.0 && want[5].d < 0.0);
}

/// For the 32-value formats the tile kernels must give the per-row SIMD dot
/// product bit for bit: both keep 8 f32 lanes of 4-byte integer sums, scale
/// and add them block by block, then sum the lanes, as ggml's x86 kernels do.
/// Results that go on to 8-bit activations must not depend on the kernel.
fn check_tiles_match_row_dots_exactly<B: BlockFormat>() {
    // An odd number of 32-value blocks; two super-blocks for the k-quants.
    let n_in = if <B as BlockFormat>::VALUES > 32 {
        512
    } else {
        32 * 9
    };
    for (n_out, n_tok) in [(1, 1), (6, 1), (13, 5), (64, 9), (8, 1), (16, 3)] {
        let wf = pseudo_random(n_in * n_out, 3 + n_out as u32);
        let w: Vec<B> = wf
            .chunks(<B as BlockFormat>::VALUES)
            .map(B::from_float)
            .collect();
        let bytes: &[u8] = bytemuck::cast_slice(&w);
        let x = pseudo_random(n_in * n_tok, 11 + n_tok as u32);
        let acts = quantize_acts(crate::dot_type(B::TYPE), &x, n_tok, n_in).unwrap();
        let a: &[B::Act] = <B::Act as ActFormat>::view(&acts.data).unwrap();
        let (bpr, apr) = (n_in / <B as BlockFormat>::VALUES, a.len() / n_tok);
        let mut y = vec![f32::NAN; n_out * n_tok];
        let weights = crate::Weights::new(B::TYPE, bytes, n_in, n_out).unwrap();
        crate::matmul_quantized(weights, &acts, &mut y).unwrap();
        let dot = crate::matmul::interleaved_dot::<B>(n_out).unwrap_or(B::best_vec_dot());
        for t in 0..n_tok {
            for r in 0..n_out {
                let want = dot(&w[r * bpr..(r + 1) * bpr], &a[t * apr..(t + 1) * apr]);
                let got = y[t * n_out + r];
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{:?} {n_out}x{n_tok} row {r} token {t}: {got} vs {want}",
                    B::TYPE
                );
            }
        }
    }
}

#[test]
fn matmul_tiles_match_row_dot_products_exactly() {
    use crate::GgmlType::*;
    for ty in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K] {
        with_block_type!(ty, B => check_tiles_match_row_dots_exactly::<B>(), _ => unreachable!());
    }
}

/// The 512-bit tiles (two rows per vector) give exactly the bits of the
/// 256-bit tiles, for one token and for batches, full and partial tiles.
#[test]
#[cfg(target_arch = "x86_64")]
fn wide_tiles_are_bit_identical_to_256_bit_tiles() {
    use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
    use tiles::fmt;
    if detect() != SimdLevel::Avx512Vnni {
        return;
    }
    fn check<B: BlockFormat, const F: u8>() {
        let (n_in, n_tok) = (32 * 10, 4);
        for rows in [4, 3, 1] {
            let wf = pseudo_random(n_in * rows, 3 + rows as u32);
            let w: Vec<B> = wf
                .chunks(<B as BlockFormat>::VALUES)
                .map(B::from_float)
                .collect();
            let x = pseudo_random(n_in * n_tok, 11);
            let acts = quantize_acts(crate::dot_type(B::TYPE), &x, n_tok, n_in).unwrap();
            let scales = acts.tile_scales().unwrap();
            let offsets =
                CodeOffset::of(B::TYPE).map_or(&[][..], |k| acts.lane_offsets(k).unwrap());
            let a: &[B::Act] = <B::Act as ActFormat>::view(&acts.data).unwrap();
            let apr = n_in / 32;
            let narrow = unsafe { avx512::tiles::tiles::<F>() };
            for (toks, wide, slim) in [
                (1, tiles512::tile::<F, 1> as TileFn, narrow.one),
                (n_tok, tiles512::tile::<F, 4>, narrow.many),
            ] {
                let mut y = [vec![0f32; 16], vec![0f32; 16]];
                for (kernel, y) in [wide, slim].into_iter().zip(&mut y) {
                    let tile = Tile {
                        w: bytemuck::cast_slice::<B, u8>(&w).as_ptr(),
                        row_bytes: apr * size_of::<B>(),
                        rows,
                        a: bytemuck::cast_slice::<B::Act, u8>(a).as_ptr(),
                        act_row_bytes: apr * size_of::<B::Act>(),
                        scales: scales.as_ptr(),
                        offsets: offsets.as_ptr(),
                        apr,
                        toks,
                        y: y.as_mut_ptr(),
                        y_stride: 4,
                    };
                    // SAFETY: AVX-512 VNNI was detected; the tile covers
                    // `rows` rows, `toks` tokens and 16 outputs.
                    unsafe { kernel(&tile) };
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&y[0]),
                    bits(&y[1]),
                    "{:?} rows {rows} toks {toks}",
                    B::TYPE
                );
                assert!(y[0][..rows].iter().all(|v| *v != 0.0), "{:?}", B::TYPE);
            }
        }
    }
    check::<BlockQ4_0, { fmt::Q4_0 }>();
    check::<BlockQ4_1, { fmt::Q4_1 }>();
    check::<BlockQ5_0, { fmt::Q5_0 }>();
    check::<BlockQ5_1, { fmt::Q5_1 }>();
    check::<BlockQ8_0, { fmt::Q8_0 }>();
}

/// Q4_0 matrices of 8k rows round as ggml's repacked kernels: every tile
/// instance (AVX2 and VNNI, one token and batches, full and partial tiles)
/// gives the portable per-block dot product bit for bit.
#[test]
#[cfg(target_arch = "x86_64")]
fn interleaved_q4_0_tiles_match_the_portable_dot_exactly() {
    use crate::blocks::{BlockQ4_0, BlockQ8_0};
    use tiles::fmt;
    let level = detect();
    if level == SimdLevel::Portable {
        return;
    }
    let Some(portable) = BlockQ4_0::interleaved_vec_dot() else {
        panic!("Q4_0 has no interleaved rounding");
    };
    let (n_in, n_tok) = (32 * 11, 4);
    let wf = pseudo_random(n_in * 4, 5);
    let w: Vec<BlockQ4_0> = wf.chunks(32).map(BlockQ4_0::from_float).collect();
    let x = pseudo_random(n_in * n_tok, 13);
    let acts = quantize_acts(crate::GgmlType::Q8_0, &x, n_tok, n_in).unwrap();
    let scales = acts.tile_scales().unwrap();
    let offsets = acts.lane_offsets(CodeOffset::K8).unwrap();
    let a: &[BlockQ8_0] = <BlockQ8_0 as ActFormat>::view(&acts.data).unwrap();
    let apr = n_in / 32;
    // SAFETY: each instance is taken only when its features were detected.
    let mut instances = vec![("avx2", unsafe { avx2::tiles::tiles::<{ fmt::Q4_0_X8 }>() })];
    if level == SimdLevel::Avx512Vnni {
        instances.push(("vnni", unsafe {
            avx512::tiles::tiles::<{ fmt::Q4_0_X8 }>()
        }));
    }
    let mut lane_rounding_differs = false;
    for (name, kernels) in instances {
        for rows in [4, 3, 1] {
            for (toks, kernel) in kernels.each() {
                let mut y = vec![f32::NAN; 4 * toks];
                let tile = Tile {
                    w: bytemuck::cast_slice::<BlockQ4_0, u8>(&w).as_ptr(),
                    row_bytes: apr * size_of::<BlockQ4_0>(),
                    rows,
                    a: bytemuck::cast_slice::<BlockQ8_0, u8>(a).as_ptr(),
                    act_row_bytes: apr * size_of::<BlockQ8_0>(),
                    scales: scales.as_ptr(),
                    offsets: offsets.as_ptr(),
                    apr,
                    toks,
                    y: y.as_mut_ptr(),
                    y_stride: 4,
                };
                // SAFETY: the features were detected; the tile covers `rows`
                // rows of `w`, `toks` tokens of `a` and 4 * toks outputs.
                unsafe { kernel(&tile) };
                for t in 0..toks {
                    for r in 0..rows {
                        let (row, at) = (&w[r * apr..(r + 1) * apr], &a[t * apr..(t + 1) * apr]);
                        let want = portable(row, at);
                        let got = y[t * 4 + r];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{name} rows {rows} token {t} row {r}"
                        );
                        lane_rounding_differs |= BlockQ4_0::best_vec_dot()(row, at) != want;
                    }
                }
            }
        }
    }
    // Otherwise this test could not tell the two roundings apart.
    assert!(lane_rounding_differs);
}
