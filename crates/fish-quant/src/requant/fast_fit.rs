//! The affine super-block fit used by re-quantisation: start each group of
//! 32 from its min/max and alternate nearest-code assignment with a
//! closed-form least-squares refit, instead of the file quantiser's
//! 21-point scale search (which `quantize_row` keeps for byte-exactness);
//! then 6-bit scales and mins ([`super::lattice`]). The eight groups are
//! fitted side by side ([`super::lanes`]).

use super::lanes::{
    code_sums, code_sums_from_min, each, group_stats, least_squares, quadratic_errors,
    transpose_portable, zip, CodeSums, GroupStats, Lanes, Rows,
};
use super::lattice::{nearest_pair, settle, super_scales, LaneCodes, Lattice};
#[cfg(target_arch = "x86_64")]
use super::vector::Avx;
use super::vector::Vector;
use crate::bits::F16Bits;
#[cfg(test)]
use crate::blocks::kfit::AffineSuperBlock;

/// Alternations of assignment and least-squares refit per start.
const REFITS: usize = 2;

/// The starts refined after the first round: all of them for Q4_K's 16
/// levels; for FQ3's 8 levels only the first (on Qwen2.5-Coder-1.5B blk.0
/// refining the others changed no error in the fourth digit, and no second
/// round at all cost 0.05 points).
#[inline(always)]
fn refined_starts(nmax: f32) -> usize {
    if nmax < 8.0 {
        1
    } else {
        NS
    }
}
/// Initial scales `(max - min) / (nmax + stretch)`: each start refits to
/// its own local optimum; the best is kept.
const NS: usize = 3;
const STARTS: [f32; NS] = [-0.5, 0.0, 0.5];

/// A block format a [`LaneFit`] packs into.
pub trait LanePacked: bytemuck::Pod {
    /// The largest code of the format.
    const NMAX: u8;
    fn pack<V: Vector>(fit: &LaneFit) -> Self;
}

/// A fitted super-block with its codes still in the fit's layout, and what
/// the fit cost.
#[derive(Clone, Copy, Default)]
pub struct LaneFit {
    pub d: F16Bits,
    pub dmin: F16Bits,
    pub scales: [u8; 8],
    pub mins: [u8; 8],
    /// `codes[i][g]` is the code of value `32 * g + i`.
    pub codes: LaneCodes,
    /// `sum (decoded - x)²`.
    pub err: f32,
    /// `sum x²`.
    pub energy: f32,
}

#[cfg(test)]
impl LaneFit {
    /// The codes in value order.
    pub fn in_value_order(&self) -> AffineSuperBlock {
        AffineSuperBlock {
            d: self.d,
            dmin: self.dmin,
            scales: self.scales,
            mins: self.mins,
            codes: std::array::from_fn(|v| self.codes[v % 32][v / 32] as u8),
        }
    }
}

/// Fits and packs `P` super-blocks (two at a time interleave their steps,
/// see [`fit_blocks`]), using AVX2 and FMA where the CPU has them; returns
/// per block the packed block, its squared error and the values' energy.
pub fn encode_superblocks<B: LanePacked, const P: usize>(
    x: [&[f32; 256]; P],
) -> [(B, f32, f32); P] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { encode_avx2(x) };
        }
    }
    let rows: [Rows; P] = std::array::from_fn(|p| transpose_portable(x[p]));
    let fits: [LaneFit; P] = fit_blocks::<Lanes, P>(std::array::from_fn(|p| &rows[p]), B::NMAX);
    let mut out = [(B::zeroed(), 0.0, 0.0); P];
    for p in 0..P {
        out[p] = packed::<B, Lanes>(&fits[p]);
    }
    out
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn encode_avx2<B: LanePacked, const P: usize>(x: [&[f32; 256]; P]) -> [(B, f32, f32); P] {
    let mut rows = [[[0f32; 8]; 32]; P];
    for p in 0..P {
        // SAFETY: AVX2 is enabled in this function's context.
        rows[p] = unsafe { super::lanes::transpose_avx2(x[p]) };
    }
    let fits: [LaneFit; P] = fit_blocks::<Avx, P>(std::array::from_fn(|p| &rows[p]), B::NMAX);
    let mut out = [(B::zeroed(), 0.0, 0.0); P];
    for p in 0..P {
        out[p] = packed::<B, Avx>(&fits[p]);
    }
    out
}

/// The packing inlined where it is called, so it runs in the same SIMD
/// context as the fit.
#[inline(always)]
fn packed<B: LanePacked, V: Vector>(fit: &LaneFit) -> (B, f32, f32) {
    (B::pack::<V>(fit), fit.err, fit.energy)
}

/// Quantises 256 values to codes in `0..=nmax` (8 groups of 32 under 6-bit
/// scales and mins), through the same dispatch as [`encode_superblock`].
#[cfg(test)]
pub fn quantize_superblock(x: &[f32; 256], nmax: u8) -> LaneFit {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { quantize_avx2(x, nmax) };
        }
    }
    quantize_portable(x, nmax)
}

#[cfg(all(test, target_arch = "x86_64"))]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_avx2(x: &[f32; 256], nmax: u8) -> LaneFit {
    // SAFETY: AVX2 is enabled in this function's context.
    let rows = unsafe { super::lanes::transpose_avx2(x) };
    let [fit] = fit_blocks::<Avx, 1>([&rows], nmax);
    fit
}

/// One super-block through the portable build (what a CPU without AVX2
/// and FMA runs), for comparison in tests.
#[cfg(test)]
pub(crate) fn quantize_portable(x: &[f32; 256], nmax: u8) -> LaneFit {
    let [fit] = fit_blocks::<Lanes, 1>([&transpose_portable(x)], nmax);
    fit
}

/// One least-squares fit per group: `x ≈ scale * q + offset`, its squared
/// error, and the code sums it came from.
#[derive(Clone, Copy, Default)]
struct Fit {
    scale: Lanes,
    offset: Lanes,
    err: Lanes,
    sums: CodeSums,
}

/// The fits of `x ≈ scale * q - m` per group with `q` in `0..=nmax`,
/// `m >= 0`, from every start, while they are refined. Each round (nearest
/// codes for the current fit, then the least-squares fit for those codes)
/// cannot increase a start's squared error; the best fit seen over all
/// starts and rounds is kept.
#[derive(Clone, Copy, Default)]
struct Starts {
    /// The groups' mins, clamped to `<= 0` (a positive offset would need a
    /// negative m; the formats clamp it).
    min: Lanes,
    /// Groups whose values are all equal.
    flat: [bool; 8],
    scale: [Lanes; NS],
    offset: [Lanes; NS],
    best: Fit,
}

impl Starts {
    #[inline(always)]
    fn new(stats: &GroupStats, nmax: f32) -> Self {
        let min = each(&stats.lo, |v| v.min(0.0));
        let range = zip(stats.hi, min, |h, m| h - m);
        Self {
            min,
            flat: std::array::from_fn(|g| stats.hi[g] <= min[g]),
            scale: std::array::from_fn(|k| each(&range, |r| r / (nmax + STARTS[k]))),
            offset: [min; NS],
            best: Fit {
                scale: each(&range, |r| r / nmax),
                offset: min,
                err: [f32::MAX; 8],
                sums: [[0.0; 8]; 3],
            },
        }
    }

    /// The code sums of the nearest codes of the starts this round refines
    /// (one pass), and how many that is (see [`refined_starts`]).
    #[inline(always)]
    fn code_sums<V: Vector>(
        &self,
        rows: &Rows,
        round: usize,
        nmax: f32,
    ) -> ([CodeSums; NS], usize) {
        let inv: [Lanes; NS] = std::array::from_fn(|k| each(&self.scale[k], |v| 1.0 / v));
        if round == 0 {
            (
                code_sums_from_min::<V, NS>(rows, &self.min, &inv, &STARTS, nmax),
                NS,
            )
        } else if refined_starts(nmax) == 1 {
            let [first] = code_sums::<V, 1>(rows, &[self.offset[0]], &[inv[0]], nmax);
            ([first, [[0.0; 8]; 3], [[0.0; 8]; 3]], 1)
        } else {
            (code_sums::<V, NS>(rows, &self.offset, &inv, nmax), NS)
        }
    }

    /// Every start's least-squares fit for its codes (lane-only work). The
    /// starts' order in the best-fit comparison is start by start. A start
    /// that fails for a group keeps its last fit there (and fails the same
    /// way again: same codes, same sums).
    #[inline(always)]
    fn refit<V: Vector>(&mut self, stats: &GroupStats, (sums, refined): &([CodeSums; NS], usize)) {
        for k in 0..*refined {
            let (scale, offset, usable) = least_squares::<V>(stats.moments(), &sums[k]);
            let err = quadratic_errors(stats, &sums[k], scale, offset);
            let keep =
                |mask: V, new: V, old: &mut Lanes| *old = mask.select(new, V::load(old)).store();
            keep(usable, scale, &mut self.scale[k]);
            keep(usable, offset, &mut self.offset[k]);
            let best = &mut self.best;
            let better = usable.and(err.lt(V::load(&best.err)));
            keep(better, err, &mut best.err);
            keep(better, scale, &mut best.scale);
            keep(better, offset, &mut best.offset);
            for i in 0..3 {
                keep(better, V::load(&sums[k][i]), &mut best.sums[i]);
            }
        }
    }

    /// `(scale, m)` per group and the code sums of that fit.
    #[inline(always)]
    fn result(&self) -> (Lanes, Lanes, CodeSums) {
        let flat = &self.flat;
        let scales = std::array::from_fn(|g| if flat[g] { 0.0 } else { self.best.scale[g] });
        let mins = std::array::from_fn(|g| {
            if flat[g] {
                -self.min[g]
            } else {
                -self.best.offset[g]
            }
        });
        (scales, mins, self.best.sums)
    }
}

/// The fits of `P` super-blocks already in rows. Every step is a pass over
/// a block's values followed by lane-only work on its result (short, but a
/// chain of dependent operations with divisions); with two blocks the
/// steps alternate between them, so one block's lane-only chain runs while
/// the other block's next pass streams through its values.
// Plain loops over the blocks, not `array::from_fn` closures: a closure
// that is not inlined is compiled without the caller's target features.
#[inline(always)]
fn fit_blocks<V: Vector, const P: usize>(rows: [&Rows; P], nmax: u8) -> [LaneFit; P] {
    let nmax = nmax as f32;
    let mut stats = [GroupStats::default(); P];
    for p in 0..P {
        stats[p] = group_stats::<V>(rows[p]);
    }
    let mut starts = [Starts::default(); P];
    for p in 0..P {
        starts[p] = Starts::new(&stats[p], nmax);
    }
    for round in 0..REFITS {
        for p in 0..P {
            let sums = starts[p].code_sums::<V>(rows[p], round, nmax);
            starts[p].refit::<V>(&stats[p], &sums);
        }
    }
    let mut lattice = [Lattice::default(); P];
    for p in 0..P {
        let (scales, mins, sums) = starts[p].result();
        lattice[p] = super_scales::<V>(&stats[p], &sums, &scales, &mins);
    }
    let mut levels = [([0.0; 8], [0.0; 8]); P];
    for p in 0..P {
        let l = &lattice[p];
        levels[p] = nearest_pair::<V>(
            rows[p],
            &stats[p],
            l.supers(),
            (l.ls, l.lm),
            &l.unrounded,
            nmax,
        );
    }
    let mut fits = [LaneFit::default(); P];
    for p in 0..P {
        let l = &lattice[p];
        let (ls, lm, codes, err) = settle::<V>(rows[p], &stats[p], l.supers(), levels[p], nmax);
        fits[p] = LaneFit {
            d: l.d,
            dmin: l.dmin,
            scales: each(&ls, |v| v as u8),
            mins: each(&lm, |v| v as u8),
            codes,
            err: err.iter().sum(),
            energy: stats[p].sx2.iter().sum(),
        };
    }
    fits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::kfit::quantize_group_scales;
    use crate::requant::lattice::group_scales_6bit;

    fn data(seed: u32) -> [f32; 256] {
        let mut s = seed;
        std::array::from_fn(|i| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            let v = (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
            // Some groups all positive, some with an outlier.
            match i / 32 {
                2 => v.abs() + 0.3,
                5 if i % 32 == 7 => 9.0,
                _ => v,
            }
        })
    }

    fn decode(sb: &AffineSuperBlock, out: &mut [f32; 256]) {
        let (d, dmin) = (sb.d.to_f32(), sb.dmin.to_f32());
        for (i, o) in out.iter_mut().enumerate() {
            let g = i / 32;
            *o = d * sb.scales[g] as f32 * sb.codes[i] as f32 - dmin * sb.mins[g] as f32;
        }
    }

    #[test]
    fn every_simd_level_gives_the_portable_bytes() {
        for seed in 0..32 {
            let x = data(seed);
            for nmax in [7, 15] {
                let (a, b) = (quantize_superblock(&x, nmax), quantize_portable(&x, nmax));
                assert_eq!(a.err.to_bits(), b.err.to_bits());
                let (a, b) = (a.in_value_order(), b.in_value_order());
                assert_eq!(
                    (a.d, a.dmin, a.scales, a.mins),
                    (b.d, b.dmin, b.scales, b.mins)
                );
                assert_eq!(a.codes, b.codes);
            }
        }
    }

    #[test]
    fn interleaved_blocks_give_the_portable_bytes_of_each() {
        use crate::blocks::BlockQ4K;
        use crate::fq3::BlockFq3;
        fn check<B: LanePacked>(x: [&[f32; 256]; 2]) {
            let pair = encode_superblocks::<B, 2>(x);
            for (p, (block, err, energy)) in pair.iter().enumerate() {
                let single = quantize_portable(x[p], B::NMAX);
                let (expected, e, s) = packed::<B, Lanes>(&single);
                assert_eq!(bytemuck::bytes_of(block), bytemuck::bytes_of(&expected));
                assert_eq!(
                    (err.to_bits(), energy.to_bits()),
                    (e.to_bits(), s.to_bits())
                );
            }
        }
        for seed in 0..16 {
            let (a, b) = (data(seed), data(seed + 100));
            check::<BlockFq3>([&a, &b]);
            check::<BlockQ4K>([&a, &b]);
        }
    }

    #[test]
    fn six_bit_group_scales_match_the_shared_quantiser() {
        let mut cases: Vec<[f32; 8]> = (0..64)
            .map(|seed| {
                let x = data(seed);
                std::array::from_fn(|g| x[g].abs() * (1.0 + seed as f32))
            })
            .collect();
        // Exact halves after scaling, zeros, a negative zero, tiny and huge
        // values, and non-finite ones.
        cases.push(std::array::from_fn(|g| g as f32 * 0.5 + 0.5));
        cases.push([0.0; 8]);
        cases.push([-0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 126.0]);
        cases.push([1e-30, 3e-30, 0.0, 1.0e-38, 2.0e-30, 5e-31, 7e-30, 1e-31]);
        cases.push([3e30, 1e30, 2e30, 0.0, 5e29, 6e30, 1.0, 4e30]);
        cases.push([f32::NAN, 1.0, 2.0, 0.5, 0.25, 3.0, 0.0, 1.5]);
        cases.push([f32::INFINITY, 1.0, 2.0, 0.5, 0.25, 3.0, 0.0, 1.5]);
        for v in &cases {
            let (d, ints) = group_scales_6bit(v);
            let (d_ref, ints_ref) = quantize_group_scales(v, 63);
            assert_eq!((d, ints), (d_ref, ints_ref), "{v:?}");
        }
    }

    #[test]
    fn codes_stay_in_range_and_error_is_small() {
        let x = data(7);
        for (nmax, bound) in [(7u8, 0.2f32), (15, 0.1)] {
            let sb = quantize_portable(&x, nmax).in_value_order();
            assert!(sb.codes.iter().all(|&q| q <= nmax));
            let mut y = [0f32; 256];
            decode(&sb, &mut y);
            // Group 5 holds an outlier; the others are uniform in [-0.5, 0.5].
            let (mut err, mut energy) = (0f32, 0f32);
            for i in (0..256).filter(|i| i / 32 != 5) {
                err += (x[i] - y[i]) * (x[i] - y[i]);
                energy += x[i] * x[i];
            }
            let rel = (err / energy).sqrt();
            assert!(rel < bound, "nmax {nmax}: {rel}");
        }
    }

    #[test]
    fn constant_and_zero_groups_decode_exactly() {
        let mut x = [0f32; 256];
        x[32..64].fill(-0.25);
        let sb = quantize_portable(&x, 15).in_value_order();
        let mut y = [0f32; 256];
        decode(&sb, &mut y);
        assert_eq!(y[..32], [0.0; 32]);
        // -0.25 is the min alone, held as 6 bits under an f16 dmin.
        assert!(
            y[32..64].iter().all(|&v| (v + 0.25).abs() < 1e-3),
            "{:?}",
            &y[32..64]
        );
    }
}
