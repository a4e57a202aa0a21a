//! The weighted fit's passes for two super-blocks at once in AVX-512's 16
//! lanes (block 0 in the low eight, block 1 in the high eight): the same
//! IEEE operations lane by lane as [`super::sums`], so the same sums and
//! codes, at half the instructions per value.

use super::sums::{weighted_code_sums, weighted_codes, PassOf, Passes, SumsOfCodes};
use crate::requant::lanes::{zip, Clamp, CodeSums, Lanes, Rows, ROUND_MAGIC};
use crate::requant::lattice::LaneCodes;
use crate::requant::vector::Avx;
use std::arch::x86_64::*;

/// Passes over two blocks in 16 lanes; only used inside functions compiled
/// with AVX-512 F (the intrinsics are inlined there).
pub(super) struct Zmm;

impl Passes for Zmm {
    #[inline(always)]
    fn code_sums<const K: usize, const P: usize>(
        x: [&Rows; P],
        w: [&Rows; P],
        pass: &[PassOf<K>; P],
        clamps: &[Clamp; K],
        nmax: f32,
    ) -> [[CodeSums; K]; P] {
        if P != 2 {
            let mut out = [[[[0.0; 8]; 3]; K]; P];
            for p in 0..P {
                out[p] = weighted_code_sums::<Avx, K>(
                    x[p],
                    w[p],
                    &pass[p].offset,
                    &pass[p].inv,
                    clamps,
                    nmax,
                );
            }
            return out;
        }
        // SAFETY: `Zmm` runs only where AVX-512 F is enabled.
        let pair = unsafe {
            code_sums_pair(
                [x[0], x[1]],
                [w[0], w[1]],
                [&pass[0], &pass[1]],
                clamps,
                nmax,
            )
        };
        std::array::from_fn(|p| pair[p])
    }

    #[inline(always)]
    fn codes<const P: usize>(
        x: [&Rows; P],
        w: [&Rows; P],
        pass: &[PassOf<1>; P],
        nmax: f32,
        codes: [&mut LaneCodes; P],
    ) -> [SumsOfCodes; P] {
        let mut out = [([[0.0; 8]; 3], [[0.0; 8]; 3]); P];
        if P != 2 {
            for (p, codes) in codes.into_iter().enumerate() {
                let (offset, inv) = (&pass[p].offset[0], &pass[p].inv[0]);
                out[p] = weighted_codes::<Avx>(x[p], w[p], offset, inv, nmax, codes);
            }
            return out;
        }
        let mut codes = codes.into_iter();
        let (Some(a), Some(b)) = (codes.next(), codes.next()) else {
            return out;
        };
        // SAFETY: `Zmm` runs only where AVX-512 F is enabled.
        let pair = unsafe {
            codes_pair(
                [x[0], x[1]],
                [w[0], w[1]],
                [&pass[0], &pass[1]],
                nmax,
                [a, b],
            )
        };
        (out[0], out[1]) = (pair[0], pair[1]);
        out
    }
}

/// Block 0's lanes low, block 1's high.
#[inline(always)]
unsafe fn join(a: &Lanes, b: &Lanes) -> __m512 {
    unsafe {
        let lo = _mm256_castps_pd(_mm256_loadu_ps(a.as_ptr()));
        let hi = _mm256_castps_pd(_mm256_loadu_ps(b.as_ptr()));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(lo), hi))
    }
}

#[inline(always)]
unsafe fn split(v: __m512) -> [Lanes; 2] {
    let mut out = [[0f32; 8]; 2];
    unsafe { _mm512_storeu_ps(out.as_mut_ptr().cast(), v) };
    out
}

/// `-(offset * inv)` of both blocks.
#[inline(always)]
unsafe fn shift(offset: [&Lanes; 2], inv: [&Lanes; 2]) -> __m512 {
    let s = [
        zip(*offset[0], *inv[0], |o, i| -(o * i)),
        zip(*offset[1], *inv[1], |o, i| -(o * i)),
    ];
    unsafe { join(&s[0], &s[1]) }
}

#[inline(always)]
unsafe fn code_sums_pair<const K: usize>(
    x: [&Rows; 2],
    w: [&Rows; 2],
    pass: [&PassOf<K>; 2],
    clamps: &[Clamp; K],
    nmax: f32,
) -> [[CodeSums; K]; 2] {
    unsafe {
        // Plain loops, not `array::from_fn` closures: a closure that is not
        // inlined is compiled without the caller's target features.
        let (zero, ceiling) = (_mm512_setzero_ps(), _mm512_set1_ps(nmax));
        let (mut shift_k, mut inv) = ([zero; K], [zero; K]);
        for k in 0..K {
            let (offset, inv_k) = (
                [&pass[0].offset[k], &pass[1].offset[k]],
                [&pass[0].inv[k], &pass[1].inv[k]],
            );
            shift_k[k] = shift(offset, inv_k);
            inv[k] = join(inv_k[0], inv_k[1]);
        }
        let shift = shift_k;
        let magic = _mm512_set1_ps(ROUND_MAGIC);
        let mut acc = [[zero; 3]; K];
        for i in 0..32 {
            let xv = join(&x[0][i], &x[1][i]);
            let wv = join(&w[0][i], &w[1][i]);
            for k in 0..K {
                let t = _mm512_fmadd_ps(xv, inv[k], shift[k]);
                let t = if clamps[k] == Clamp::Both {
                    _mm512_max_ps(t, zero)
                } else {
                    t
                };
                let t = if clamps[k] != Clamp::Neither {
                    _mm512_min_ps(t, ceiling)
                } else {
                    t
                };
                let q = _mm512_sub_ps(_mm512_add_ps(t, magic), magic);
                let wq = _mm512_mul_ps(wv, q);
                let [sl, sl2, sxl] = &mut acc[k];
                *sl = _mm512_add_ps(*sl, wq);
                *sl2 = _mm512_fmadd_ps(wq, q, *sl2);
                *sxl = _mm512_fmadd_ps(wq, xv, *sxl);
            }
        }
        let mut out = [[[[0f32; 8]; 3]; K]; 2];
        for k in 0..K {
            for s in 0..3 {
                let [a, b] = split(acc[k][s]);
                out[0][k][s] = a;
                out[1][k][s] = b;
            }
        }
        out
    }
}

#[inline(always)]
unsafe fn codes_pair(
    x: [&Rows; 2],
    w: [&Rows; 2],
    pass: [&PassOf<1>; 2],
    nmax: f32,
    codes: [&mut LaneCodes; 2],
) -> [SumsOfCodes; 2] {
    unsafe {
        let shift = shift(
            [&pass[0].offset[0], &pass[1].offset[0]],
            [&pass[0].inv[0], &pass[1].inv[0]],
        );
        let inv = join(&pass[0].inv[0], &pass[1].inv[0]);
        let (zero, ceiling) = (_mm512_setzero_ps(), _mm512_set1_ps(nmax));
        let magic = _mm512_set1_ps(ROUND_MAGIC);
        let low_byte = _mm512_set1_epi32(0xff);
        let mut out = [([[0f32; 8]; 3], [[0f32; 8]; 3]); 2];
        let (mut sl, mut sl2, mut sxl) = (zero, zero, zero);
        let (mut pl, mut pl2, mut pxl) = (zero, zero, zero);
        for i in 0..32 {
            let xv = join(&x[0][i], &x[1][i]);
            let wv = join(&w[0][i], &w[1][i]);
            let t = _mm512_min_ps(
                _mm512_max_ps(_mm512_fmadd_ps(xv, inv, shift), zero),
                ceiling,
            );
            let biased = _mm512_add_ps(t, magic);
            let bits = _mm512_and_si512(_mm512_castps_si512(biased), low_byte);
            let (low, high) = (
                _mm512_castsi512_si256(bits),
                _mm512_extracti64x4_epi64::<1>(bits),
            );
            _mm256_storeu_si256(codes[0][i].as_mut_ptr().cast(), low);
            _mm256_storeu_si256(codes[1][i].as_mut_ptr().cast(), high);
            let q = _mm512_sub_ps(biased, magic);
            let wq = _mm512_mul_ps(wv, q);
            sl = _mm512_add_ps(sl, wq);
            sl2 = _mm512_fmadd_ps(wq, q, sl2);
            sxl = _mm512_fmadd_ps(wq, xv, sxl);
            pl = _mm512_add_ps(pl, q);
            pl2 = _mm512_fmadd_ps(q, q, pl2);
            pxl = _mm512_fmadd_ps(q, xv, pxl);
        }
        for (s, (weighted, plain)) in [(sl, pl), (sl2, pl2), (sxl, pxl)].into_iter().enumerate() {
            let ([a, b], [c, d]) = (split(weighted), split(plain));
            (out[0].0[s], out[1].0[s]) = (a, b);
            (out[0].1[s], out[1].1[s]) = (c, d);
        }
        out
    }
}
