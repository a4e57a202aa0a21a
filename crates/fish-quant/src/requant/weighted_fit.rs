//! The importance-weighted affine super-block fit: the same layout as the
//! fast fit (eight groups of 32 under 6-bit scales and mins), but every step
//! minimises `sum_i w_i (x_i - q_i)²` with per-value weights — the activation
//! energy of each input column from a calibration run — so the columns the
//! model actually drives get the smaller error.
//!
//! It runs in the fast fit's lane layout (the eight groups side by side,
//! the weights as a second set of rows): a few starts refined by the
//! weighted least squares ([`search`]), then the 6-bit levels
//! ([`levels`]), every candidate ranked by its weighted error from weighted
//! code sums ([`sums`]). The AVX2 build and the portable build give the same
//! bytes.

#[cfg(test)]
mod grid;
mod levels;
mod search;
mod sums;
#[cfg(target_arch = "x86_64")]
mod wide;

use super::fast_fit::{LaneFit, LanePacked};
use super::lanes::{each, transpose_portable, Clamp, CodeSums, ErrorForm, Lanes, Moments, Rows};
use super::lattice::{scaled, Lattice, Levels};
#[cfg(target_arch = "x86_64")]
use super::vector::Avx;
use super::vector::Vector;
#[cfg(test)]
use crate::blocks::kfit::AffineSuperBlock;
use levels::{PairSearch, Settle};
use search::Search;
use sums::{Lanewise, PassOf, Passes, WeightedStats};

/// A row's per-value weights (a multiple of 256, finite and non-negative)
/// in the fit's layout, one [`Rows`] per super-block. The weights belong to
/// columns, so one conversion serves every row of a matrix. A group whose
/// weights are all zero gets weight 1 throughout (without weight every fit
/// of it would be degenerate): it falls back to the plain error.
pub(super) fn weight_rows(w: &[f32]) -> Vec<Rows> {
    w.chunks_exact(256)
        .map(|block| {
            let mut rows = transpose_portable(block.try_into().expect("256 weights"));
            for g in 0..8 {
                if rows.iter().all(|row| row[g] <= 0.0) {
                    rows.iter_mut().for_each(|row| row[g] = 1.0);
                }
            }
            rows
        })
        .collect()
}

/// Fits and packs `P` super-blocks (two at a time interleave their steps,
/// as the plain fit does) minimising the `w`-weighted squared error (`w`
/// from [`weight_rows`]); returns per block the packed block, its plain
/// squared error and the values' energy.
pub(super) fn encode_superblocks_weighted<B: LanePacked, const P: usize>(
    x: [&[f32; 256]; P],
    w: [&Rows; P],
) -> [(B, f32, f32); P] {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512vl") && has!("fma") {
            // SAFETY: the CPU supports AVX-512 F/VL and FMA (checked just above).
            return unsafe { encode_avx512(x, w) };
        }
        if has!("avx2") && has!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { encode_avx2(x, w) };
        }
    }
    let rows: [Rows; P] = std::array::from_fn(|p| transpose_portable(x[p]));
    encode::<B, Lanes, Lanewise<Lanes>, P>(std::array::from_fn(|p| &rows[p]), w)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn encode_avx2<B: LanePacked, const P: usize>(
    x: [&[f32; 256]; P],
    w: [&Rows; P],
) -> [(B, f32, f32); P] {
    let mut rows = [[[0f32; 8]; 32]; P];
    for p in 0..P {
        // SAFETY: AVX2 is enabled in this function's context.
        rows[p] = unsafe { super::lanes::transpose_avx2(x[p]) };
    }
    encode::<B, Avx, Lanewise<Avx>, P>(std::array::from_fn(|p| &rows[p]), w)
}

/// The AVX2 build with AVX-512's 32 vector registers: the same 8-lane
/// operations (same bytes), but the five starts' accumulators no longer
/// spill to the stack.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
unsafe fn encode_avx512<B: LanePacked, const P: usize>(
    x: [&[f32; 256]; P],
    w: [&Rows; P],
) -> [(B, f32, f32); P] {
    let mut rows = [[[0f32; 8]; 32]; P];
    for p in 0..P {
        // SAFETY: AVX2 is enabled in this function's context.
        rows[p] = unsafe { super::lanes::transpose_avx2(x[p]) };
    }
    encode::<B, Avx, wide::Zmm, P>(std::array::from_fn(|p| &rows[p]), w)
}

#[inline(always)]
fn encode<B: LanePacked, V: Vector, S: Passes, const P: usize>(
    x: [&Rows; P],
    w: [&Rows; P],
) -> [(B, f32, f32); P] {
    let fits = fit_blocks::<V, S, P>(x, w, B::NMAX);
    let mut out = [(B::zeroed(), 0.0, 0.0); P];
    for p in 0..P {
        out[p] = (B::pack::<V>(&fits[p]), fits[p].err, fits[p].energy);
    }
    out
}

/// The weighted fits of `P` super-blocks: every step is a pass over the
/// blocks' values (run by `S`, which may take two blocks at once) followed
/// by lane-only work per block on its result. Plain loops over the blocks,
/// not closures (a closure that is not inlined loses the caller's target
/// features).
#[inline(always)]
fn fit_blocks<V: Vector, S: Passes, const P: usize>(
    x: [&Rows; P],
    w: [&Rows; P],
    nmax: u8,
) -> [LaneFit; P] {
    let nmax = nmax as f32;
    let mut stats = [WeightedStats::default(); P];
    for p in 0..P {
        stats[p] = sums::weighted_stats::<V>(x[p], w[p]);
    }
    let mut search = [Search::default(); P];
    for p in 0..P {
        search[p] = Search::new(&stats[p], nmax);
    }
    for round in 0..search::REFITS {
        let mut pass = [search[0].pass(); P];
        for p in 0..P {
            pass[p] = search[p].pass();
        }
        let sums = S::code_sums(x, w, &pass, &Search::clamps(round), nmax);
        for p in 0..P {
            search[p].refit::<V>(&stats[p], &sums[p]);
        }
    }
    let mut lattice = [Lattice::default(); P];
    for p in 0..P {
        lattice[p] = levels::lattice::<V>(&stats[p], &search[p].result(&stats[p]));
    }
    let mut pairs = [PairSearch::default(); P];
    for p in 0..P {
        pairs[p] = PairSearch::new(&lattice[p]);
    }
    let mut pass = [pairs[0].pass(); P];
    for p in 0..P {
        pass[p] = pairs[p].pass();
    }
    let sums = S::code_sums(x, w, &pass, &[Clamp::Both; 2], nmax);
    let mut settle = [Settle::default(); P];
    for p in 0..P {
        let levels = pairs[p].best::<V>(&stats[p], &sums[p]);
        settle[p] = Settle::new(lattice[p].supers(), levels);
    }
    let mut pass = [PassOf {
        offset: [[0.0; 8]],
        inv: [[0.0; 8]],
    }; P];
    for p in 0..P {
        let (offset, inv) = settle[p].pass();
        pass[p] = PassOf {
            offset: [offset],
            inv: [inv],
        };
    }
    let mut fits = [LaneFit::default(); P];
    let codes = fits.each_mut().map(|fit| &mut fit.codes);
    let sums = S::codes(x, w, &pass, nmax, codes);
    for p in 0..P {
        let (weighted, plain) = &sums[p];
        let levels = settle[p].best::<V>(&stats[p], weighted);
        set_levels::<V>(&mut fits[p], &lattice[p], levels, &stats[p], plain);
    }
    fits
}

/// The fit's super-scales and levels as stored, with the plain error of its
/// codes (already in `fit`) under them, from their plain sums (as the plain
/// fit reports it).
#[inline(always)]
fn set_levels<V: Vector>(
    fit: &mut LaneFit,
    l: &Lattice,
    (ls, lm): (Levels, Levels),
    stats: &WeightedStats,
    plain_sums: &CodeSums,
) {
    let (df, dminf) = l.supers();
    let plain = Moments {
        count: V::splat(32.0),
        sx: V::load(&stats.sx),
        sx2: V::load(&stats.sx2),
    };
    let err = ErrorForm::new(plain, plain_sums)
        .error_of(V::load(&scaled(df, &ls)), V::load(&scaled(-dminf, &lm)));
    (fit.d, fit.dmin) = (l.d, l.dmin);
    fit.scales = each(&ls, |v| v as u8);
    fit.mins = each(&lm, |v| v as u8);
    // Rounding can leave a perfect fit a hair below zero.
    fit.err = each(&err.store(), |e| e.max(0.0)).iter().sum();
    fit.energy = stats.sx2.iter().sum();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requant::fast_fit::quantize_superblock;

    fn rows_of(w: &[f32; 256]) -> Rows {
        weight_rows(w)[0]
    }

    /// The fit through the dispatch, in value order.
    fn quantize_superblock_weighted(x: &[f32; 256], w: &[f32; 256], nmax: u8) -> AffineSuperBlock {
        simd_builds(x, w, nmax).swap_remove(0)
    }

    fn quantize_portable(x: &[f32; 256], w: &[f32; 256], nmax: u8) -> AffineSuperBlock {
        let [fit] =
            fit_blocks::<Lanes, Lanewise<Lanes>, 1>([&transpose_portable(x)], [&rows_of(w)], nmax);
        fit.in_value_order()
    }

    fn data(seed: u32) -> [f32; 256] {
        let mut s = seed;
        std::array::from_fn(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
    }

    fn decode(sb: &AffineSuperBlock) -> [f32; 256] {
        let (d, dmin) = (sb.d.to_f32(), sb.dmin.to_f32());
        std::array::from_fn(|i| {
            let g = i / 32;
            d * sb.scales[g] as f32 * sb.codes[i] as f32 - dmin * sb.mins[g] as f32
        })
    }

    fn weighted_error(x: &[f32; 256], y: &[f32; 256], w: &[f32; 256]) -> f32 {
        (0..256).map(|i| w[i] * (x[i] - y[i]) * (x[i] - y[i])).sum()
    }

    /// Weights with a few heavy columns, as activation energy has.
    fn skewed_weights(seed: u32) -> [f32; 256] {
        let mut s = seed.wrapping_add(99);
        std::array::from_fn(|i| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            let base = (s >> 8) as f32 / (1u32 << 24) as f32 + 0.01;
            if i % 37 == 3 {
                100.0 * base
            } else {
                base
            }
        })
    }

    #[test]
    fn weighting_lowers_the_weighted_error_against_the_plain_fit() {
        let (mut plain, mut weighted) = (0f32, 0f32);
        for seed in 0..16 {
            let x = data(seed);
            let w = skewed_weights(seed);
            let a = decode(&quantize_superblock(&x, 7).in_value_order());
            let b = decode(&quantize_superblock_weighted(&x, &w, 7));
            plain += weighted_error(&x, &a, &w);
            weighted += weighted_error(&x, &b, &w);
        }
        assert!(
            weighted < 0.8 * plain,
            "weighted {weighted} vs plain {plain}"
        );
    }

    #[test]
    fn codes_stay_in_range_and_zero_weight_groups_still_fit() {
        let x = data(3);
        let mut w = skewed_weights(3);
        w[64..96].fill(0.0);
        let sb = quantize_superblock_weighted(&x, &w, 7);
        assert!(sb.codes.iter().all(|&q| q <= 7));
        let y = decode(&sb);
        let ones = [1.0; 256];
        let (mut err, mut energy) = (0f32, 0f32);
        for i in 64..96 {
            err += ones[i] * (x[i] - y[i]) * (x[i] - y[i]);
            energy += x[i] * x[i];
        }
        assert!((err / energy).sqrt() < 0.2, "{}", (err / energy).sqrt());
    }

    /// The fit through every SIMD build this CPU can run, the widest first
    /// (the one the dispatch picks).
    fn simd_builds(x: &[f32; 256], w: &[f32; 256], nmax: u8) -> Vec<AffineSuperBlock> {
        #[allow(unused_mut)]
        let mut out = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2(x: &[f32; 256], w: &Rows, nmax: u8) -> LaneFit {
                let rows = unsafe { crate::requant::lanes::transpose_avx2(x) };
                let [fit] = fit_blocks::<Avx, Lanewise<Avx>, 1>([&rows], [w], nmax);
                fit
            }
            #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
            unsafe fn avx512(x: &[f32; 256], w: &Rows, nmax: u8) -> LaneFit {
                let rows = unsafe { crate::requant::lanes::transpose_avx2(x) };
                let [fit] = fit_blocks::<Avx, Lanewise<Avx>, 1>([&rows], [w], nmax);
                fit
            }
            if has!("avx512f") && has!("avx512vl") && has!("fma") {
                // SAFETY: the CPU supports AVX-512 F/VL and FMA.
                out.push(unsafe { avx512(x, &rows_of(w), nmax) }.in_value_order());
            }
            if has!("avx2") && has!("fma") {
                // SAFETY: the CPU supports AVX2 and FMA.
                out.push(unsafe { avx2(x, &rows_of(w), nmax) }.in_value_order());
            }
        }
        out.push(quantize_portable(x, w, nmax));
        out
    }

    /// Two blocks through the dispatch (on AVX-512 their passes share 16
    /// lanes) against each block alone through the portable build.
    #[test]
    fn pairs_of_blocks_give_the_portable_bytes_of_each() {
        use crate::blocks::BlockQ4K;
        use crate::fq3::BlockFq3;
        fn check<B: LanePacked>(x: [&[f32; 256]; 2], w: [&Rows; 2]) {
            let pair = encode_superblocks_weighted::<B, 2>(x, w);
            for (p, (block, err, energy)) in pair.iter().enumerate() {
                let rows = transpose_portable(x[p]);
                let [fit] = fit_blocks::<Lanes, Lanewise<Lanes>, 1>([&rows], [w[p]], B::NMAX);
                let expected = B::pack::<Lanes>(&fit);
                assert_eq!(bytemuck::bytes_of(block), bytemuck::bytes_of(&expected));
                assert_eq!(
                    (err.to_bits(), energy.to_bits()),
                    (fit.err.to_bits(), fit.energy.to_bits())
                );
            }
        }
        for seed in 0..16 {
            let (a, b) = (data(seed), data(seed + 100));
            let mut wb = skewed_weights(seed + 7);
            if seed % 4 == 1 {
                wb[32..64].fill(0.0);
            }
            let w = [rows_of(&skewed_weights(seed)), rows_of(&wb)];
            check::<BlockFq3>([&a, &b], [&w[0], &w[1]]);
            check::<BlockQ4K>([&a, &b], [&w[0], &w[1]]);
        }
    }

    #[test]
    fn every_simd_level_gives_the_portable_bytes() {
        for seed in 0..32 {
            let (x, mut w) = (data(seed), skewed_weights(seed));
            if seed % 4 == 1 {
                w[96..128].fill(0.0);
            }
            for nmax in [7, 15] {
                let b = quantize_portable(&x, &w, nmax);
                for a in simd_builds(&x, &w, nmax) {
                    assert_eq!(
                        (a.d, a.dmin, a.scales, a.mins),
                        (b.d, b.dmin, b.scales, b.mins)
                    );
                    assert_eq!(a.codes, b.codes);
                }
            }
        }
    }

    #[test]
    fn lane_fit_is_as_good_as_the_grid_on_synthetic_blocks() {
        for nmax in [7, 15] {
            let (mut grid, mut lanes) = (0f64, 0f64);
            for seed in 0..64 {
                let (x, w) = (data(seed), skewed_weights(seed));
                let a = decode(&grid::quantize_superblock_weighted_grid(&x, &w, nmax));
                let b = decode(&quantize_superblock_weighted(&x, &w, nmax));
                grid += weighted_error(&x, &a, &w) as f64;
                lanes += weighted_error(&x, &b, &w) as f64;
            }
            assert!(
                lanes < 1.01 * grid,
                "nmax {nmax}: lanes {lanes} vs grid {grid}"
            );
        }
    }

    /// The weighted error of the lane fit against the grid on real tensors:
    /// rows spread over every matrix of blk.0 of Qwen2.5-Coder 1.5B Q4_K_M
    /// (when the file is present), Q4_K ones to FQ3 codes (nmax 7) and Q6_K
    /// ones to Q4_K codes (nmax 15), under two synthetic importances: a
    /// heavy-tailed random one (as activation energy is) and each column's
    /// mean magnitude.
    #[test]
    fn lane_fit_is_within_a_percent_of_the_grid_on_real_tensors() {
        use fish_gguf::GgmlType;
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
        let Ok(file) = fish_gguf::Gguf::open(&path) else {
            eprintln!("skipped: {} not present", path.display());
            return;
        };
        const ROWS: usize = 24;
        // Per importance: (grid error, lane error).
        let mut totals = [(0f64, 0f64); 2];
        for t in file.tensors() {
            let nmax = match t.ty {
                GgmlType::Q4_K => 7,
                GgmlType::Q6_K => 15,
                _ => continue,
            };
            if !t.name.starts_with("blk.0.") || t.dims.len() != 2 {
                continue;
            }
            let (n_in, n_rows) = (t.dims[0] as usize, t.dims[1] as usize);
            let data = file.tensor_data(t);
            let row_len = data.len() / n_rows;
            let mut x = vec![0f32; n_in];
            let mut mean_abs = vec![0f64; n_in];
            let mut rows = Vec::new();
            for r in 0..n_rows {
                crate::rows::dequant_row(t.ty, &data[r * row_len..(r + 1) * row_len], &mut x)
                    .unwrap();
                mean_abs
                    .iter_mut()
                    .zip(&x)
                    .for_each(|(m, v)| *m += v.abs() as f64);
                if r % (n_rows / ROWS) == 0 {
                    rows.push(x.clone());
                }
            }
            let mut s = 7u32;
            let heavy: Vec<f32> = (0..n_in)
                .map(|_| {
                    s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                    (12.0 * ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5)).exp()
                })
                .collect();
            let column: Vec<f32> = mean_abs.iter().map(|&m| m as f32 + 1e-6).collect();
            let mut tensor = [(0f64, 0f64); 2];
            for (k, importance) in [heavy, column].iter().enumerate() {
                for row in &rows {
                    for (xb, wb) in row.chunks_exact(256).zip(importance.chunks_exact(256)) {
                        let (xb, wb): (&[f32; 256], &[f32; 256]) =
                            (xb.try_into().unwrap(), wb.try_into().unwrap());
                        let a = decode(&grid::quantize_superblock_weighted_grid(xb, wb, nmax));
                        let b = decode(&quantize_superblock_weighted(xb, wb, nmax));
                        tensor[k].0 += weighted_error(xb, &a, wb) as f64;
                        tensor[k].1 += weighted_error(xb, &b, wb) as f64;
                    }
                }
                totals[k].0 += tensor[k].0;
                totals[k].1 += tensor[k].1;
            }
            eprintln!(
                "{} {}: lanes / grid weighted error: heavy {:.4}, column {:.4}",
                t.name,
                t.ty,
                tensor[0].1 / tensor[0].0,
                tensor[1].1 / tensor[1].0
            );
        }
        let ratios = totals.map(|(grid, lanes)| lanes / grid);
        eprintln!(
            "blk.0 lanes / grid: heavy {:.4}, column {:.4}",
            ratios[0], ratios[1]
        );
        assert!(ratios.iter().all(|&r| r < 1.01), "{ratios:?}");
    }
}
