//! The open-time check of the fragments kernel (frags.rs): Q4_K and Q6_K
//! weights and f16 inputs chosen so that every decoded weight, product and
//! partial sum is exact in f16 and f32, multiplied on each prefill tile the
//! plans may take, every output compared with the exact value. A wrong
//! element layout, a mis-decoded code or a lost fragment shows as a
//! difference; rounding cannot. The wide tile is also checked on rows long
//! enough that plans split their steps across workgroups (split_k.rs), as
//! they do for long-row projections with few tiles, so the partials and
//! their sum are checked on the device too.

use crate::coopmat::CoopMatTile;
use crate::frags::FragsTile;
use crate::{GatedActivation, Gpu, Kernel, MatmulInput};
use fish_gguf::GgmlType;

/// Values per row of the unsplit checks: two super-blocks.
const N_IN: usize = 512;

/// Longest rows of the split check: every weight is at most 96 in
/// magnitude (Q6_K) and every input at most 3/8, all multiples of 1/8, so
/// any partial sum of up to this many products stays below 2^21 and is
/// exact in f32.
const MAX_SPLIT_N_IN: usize = 32768;

/// Tokens whose inputs differ: x[t] depends on t only through t % 7.
const TOKEN_PERIOD: usize = 7;

/// x[t][k] of rows of n_in values: multiples of 1/8 in [-3/8, 3/8] (exact
/// in f16), the same for tokens t and t + TOKEN_PERIOD.
fn input(n_tok: usize, n_in: usize) -> Vec<f32> {
    (0..n_tok * n_in)
        .map(|i| {
            let (t, k) = (i / n_in, i % n_in);
            (((t * 5 + k * 3) % TOKEN_PERIOD) as f32 - 3.0) * 0.125
        })
        .collect()
}

/// One Q4_K row with d = dmin = 1: value k is sc * q - m with q = (7 r + 3
/// k) % 16, sub-block j's scale 1 + (r + j) % 4 and min (r + 2 j) % 4 (all
/// below 16, so the high bits of the packed scales stay zero). Returns the
/// GGUF bytes and the values (n_in of them).
fn q4_k_row(r: usize, n_in: usize) -> (Vec<u8>, Vec<f64>) {
    let mut bytes = Vec::new();
    let mut values = Vec::new();
    for sb in 0..n_in / 256 {
        let q = |k: usize| ((7 * r + 3 * (256 * sb + k)) % 16) as u8;
        let sc = |j: usize| (1 + (r + j) % 4) as u8;
        let m = |j: usize| ((r + 2 * j) % 4) as u8;
        bytes.extend(half::f16::from_f32(1.0).to_le_bytes());
        bytes.extend(half::f16::from_f32(1.0).to_le_bytes());
        let mut scales = [0u8; 12];
        for j in 0..4 {
            scales[j] = sc(j);
            scales[j + 4] = m(j);
            scales[j + 8] = sc(j + 4) | (m(j + 4) << 4);
        }
        bytes.extend(scales);
        for c in 0..4 {
            for i in 0..32 {
                bytes.push(q(64 * c + i) | (q(64 * c + 32 + i) << 4));
            }
        }
        for k in 0..256 {
            let j = k / 32;
            values.push(f64::from(sc(j)) * f64::from(q(k)) - f64::from(m(j)));
        }
    }
    (bytes, values)
}

/// One Q6_K row with d = 1: value k is s * (code - 32) with code = (5 r +
/// 11 k) % 64 and its 16-value scale s = 1 + (r + index) % 3.
fn q6_k_row(r: usize, n_in: usize) -> (Vec<u8>, Vec<f64>) {
    let mut bytes = Vec::new();
    let mut values = vec![0.0; n_in];
    for sb in 0..n_in / 256 {
        let code = |k: usize| ((5 * r + 11 * (256 * sb + k)) % 64) as u8;
        let scale = |i: usize| (1 + (r + i) % 3) as i8;
        let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
        for n in 0..2 {
            for l in 0..32 {
                let c = |quarter: usize| code(128 * n + l + 32 * quarter);
                ql[64 * n + l] = (c(0) & 0xF) | ((c(2) & 0xF) << 4);
                ql[64 * n + l + 32] = (c(1) & 0xF) | ((c(3) & 0xF) << 4);
                qh[32 * n + l] =
                    (c(0) >> 4) | ((c(1) >> 4) << 2) | ((c(2) >> 4) << 4) | ((c(3) >> 4) << 6);
                for quarter in 0..4 {
                    let v = 128 * n + l + 32 * quarter;
                    let s = scale(8 * n + l / 16 + 2 * quarter);
                    values[256 * sb + v] = f64::from(s) * (f64::from(code(v)) - 32.0);
                }
            }
        }
        bytes.extend(ql);
        bytes.extend(qh);
        bytes.extend((0..16).map(|i| scale(i) as u8));
        bytes.extend(half::f16::from_f32(1.0).to_le_bytes());
    }
    (bytes, values)
}

/// One check's product: the tile (wide or not), rows, tokens and values
/// per row.
#[derive(Clone, Copy)]
struct Shape {
    wide: bool,
    rows: usize,
    n_tok: usize,
    n_in: usize,
}

/// Values per row at which a dispatch of `tiles` wide tiles splits its
/// steps in two or more (the wide split rule, split_k.rs): twice the fewest
/// steps a share keeps, in whole super-blocks. None where the rule is off
/// (FISH_VK_WIDE_SPLIT=0), where such rows would not split, or where they
/// would be too long for exact sums (MAX_SPLIT_N_IN).
fn split_check_n_in(tile: &CoopMatTile, tiles: u32) -> Option<usize> {
    let rule = crate::split_k::SplitRule::wide()?;
    let n_in = (2 * rule.min_steps * tile.k_step).next_multiple_of(256);
    let split = crate::split_k::SplitPlanner::new(rule).split(tile, tiles, n_in);
    (split.ways > 1 && n_in as usize <= MAX_SPLIT_N_IN).then_some(n_in as usize)
}

/// Ok where `checked` checks ran and none failed; else all `failures`, or
/// that no tile could be checked (the kernel would never run).
fn verdict(checked: usize, failures: Vec<String>) -> Result<(), String> {
    match (checked, failures.is_empty()) {
        (0, _) => Err("no prefill tile has a layout of the kernel".into()),
        (_, true) => Ok(()),
        (_, false) => Err(format!(
            "{} of {checked} checks failed: {}",
            failures.len(),
            failures.join(" | ")
        )),
    }
}

impl Gpu {
    /// Multiplies the check's weights by its inputs through the fragments
    /// kernel of `kernel` (`Kernel::CoopMat`, or `Kernel::CoopMatEmulated`
    /// in tests) on the prefill tile and the wide tile, Q4_K and Q6_K, each
    /// with a partial tile of rows and of tokens (and the wide tile once
    /// more on rows that split, `split_check_n_in`), and compares every
    /// output with the exact value. Err says what differed.
    ///
    /// A tile the kernel has no layout for keeps the staged kernel in
    /// plans, so it is not checked; with no tile checked at all this is an
    /// error (the kernel would never run).
    pub fn check_prefill_frags(&self, kernel: Kernel) -> Result<(), String> {
        self.check_prefill_frags_of(kernel, &[GgmlType::Q4_K, GgmlType::Q6_K])
    }

    /// `check_prefill_frags` for the weight types `types` only (at open:
    /// those plans give the kernel, so that a type they never give it costs
    /// no pipeline and no check).
    pub(crate) fn check_prefill_frags_of(
        &self,
        kernel: Kernel,
        types: &[GgmlType],
    ) -> Result<(), String> {
        // Every tile and type is checked, so that one failure's message
        // also says which of the others hold.
        let tiles = self.frags_tiles(kernel)?;
        let mut checked = 0;
        let mut failures = Vec::new();
        for &ty in types {
            for &(wide, tile, _) in &tiles {
                // Two tiles of rows and two of tokens, the second of each partial.
                let (rows, n_tok) = (tile.rows() as usize + 16, tile.tokens() as usize + 8);
                let mut row_lengths = vec![N_IN];
                let tiles =
                    rows.div_ceil(tile.rows() as usize) * n_tok.div_ceil(tile.tokens() as usize);
                row_lengths.extend(
                    wide.then(|| split_check_n_in(&tile, tiles as u32))
                        .flatten(),
                );
                for n_in in row_lengths {
                    let shape = Shape {
                        wide,
                        rows,
                        n_tok,
                        n_in,
                    };
                    if let Err(why) = self.check_one(kernel, ty, shape) {
                        failures.push(why);
                    }
                    checked += 1;
                }
            }
        }
        verdict(checked, failures)
    }

    /// The prefill tiles of `kernel` that the fragments kernel has a layout
    /// for, each with whether it is the wide one: what plans may give it
    /// (a tile without one keeps the staged kernel).
    fn frags_tiles(&self, kernel: Kernel) -> Result<Vec<(bool, CoopMatTile, FragsTile)>, String> {
        let tile = self.coopmat_tile(kernel).map_err(|e| e.to_string())?;
        let tiles = [(false, tile), (true, self.wide_tile_of(kernel))];
        Ok(tiles
            .into_iter()
            .filter_map(|(wide, tile)| {
                let tile = tile?;
                let layout = crate::frags::layout_for(tile.rows(), tile.tokens())?;
                Some((wide, tile, layout))
            })
            .collect())
    }

    /// The open-time check of the kernel's gate/up form
    /// (`Kernel::PrefillGateUp`, `Gpu::prefill_gate_up`): the check's Q4_K
    /// rows as gate (row r) and up (row r + 5), on each prefill tile the
    /// plans may take with a partial tile of output rows and of tokens.
    /// Gate and up sum exactly (as in `check_prefill_frags`), so each
    /// output must be act(gate) * up to within its f16 rounding and the
    /// device's exp; a wrong row, token or pairing of gate and up is far
    /// outside that. Err says what differed; no tile to check is an error.
    pub fn check_prefill_gate_up(&self, kernel: Kernel) -> Result<(), String> {
        let mut checked = 0;
        let mut failures = Vec::new();
        for (wide, tile, layout) in self.frags_tiles(kernel)? {
            if !layout.rf.is_multiple_of(2) {
                continue;
            }
            // A tile's output rows are half its weight rows.
            let rows = tile.rows() as usize / 2 + 16;
            let n_tok = tile.tokens() as usize + 8;
            if let Err(why) = self.check_gate_up_one(kernel, wide, rows, n_tok) {
                failures.push(why);
            }
            checked += 1;
        }
        verdict(checked, failures)
    }

    fn check_gate_up_one(
        &self,
        kernel: Kernel,
        wide: bool,
        rows: usize,
        n_tok: usize,
    ) -> Result<(), String> {
        const UP_ROW_SHIFT: usize = 5;
        let encode = |shift: usize| -> (Vec<u8>, Vec<Vec<f64>>) {
            let (bytes, values): (Vec<Vec<u8>>, Vec<Vec<f64>>) =
                (0..rows).map(|r| q4_k_row(r + shift, N_IN)).unzip();
            (bytes.concat(), values)
        };
        let (gate_bytes, gate_w) = encode(0);
        let (up_bytes, up_w) = encode(UP_ROW_SHIFT);
        let x = input(n_tok, N_IN);
        let gate = self
            .upload(GgmlType::Q4_K, &gate_bytes, N_IN, rows)
            .map_err(|e| e.to_string())?;
        let up = self.upload(GgmlType::Q4_K, &up_bytes, N_IN, rows);
        let y = up.as_ref().map_err(|e| e.to_string()).and_then(|&up| {
            self.with_prefill_frags(true, || {
                self.with_wide_tiles(wide, || {
                    let act = GatedActivation::Silu;
                    self.prefill_gate_up((gate, up), &x, n_tok, kernel, act)
                })
            })
            .map_err(|e| e.to_string())
        });
        let freed = [Ok(gate), up].into_iter().flatten().map(|h| self.free(h));
        freed
            .collect::<Result<Vec<()>, _>>()
            .map_err(|e| e.to_string())?;
        let y = y?;
        let dot = |w: &[f64], t: usize| -> f64 {
            let xt = &x[t * N_IN..(t + 1) * N_IN];
            w.iter().zip(xt).map(|(&a, &b)| a * f64::from(b)).sum()
        };
        let mut first = None;
        let mut wrong = 0;
        for t in 0..n_tok.min(TOKEN_PERIOD) {
            for r in 0..rows {
                let (g, u) = (dot(&gate_w[r], t), dot(&up_w[r], t));
                let want = g / (1.0 + (-g).exp()) * u;
                // f16 keeps 11 bits; the device's exp a few f32 ulps.
                let tolerance = want.abs() / 512.0 + 1e-6;
                // Tokens t + 7k have token t's inputs.
                for tok in (t..n_tok).step_by(TOKEN_PERIOD) {
                    let got = f64::from(y[tok * rows + r]);
                    if (got - want).abs() > tolerance || got.is_nan() {
                        wrong += 1;
                        first.get_or_insert(format!("y[t={tok}, r={r}] = {got}, want {want}"));
                    }
                }
            }
        }
        let Some(first) = first else { return Ok(()) };
        Err(format!(
            "gate/up wide={wide}: {first}; {wrong} of {} outputs differ",
            y.len()
        ))
    }

    fn check_one(&self, kernel: Kernel, ty: GgmlType, shape: Shape) -> Result<(), String> {
        let Shape {
            wide,
            rows,
            n_tok,
            n_in,
        } = shape;
        let encode = match ty {
            GgmlType::Q6_K => q6_k_row,
            _ => q4_k_row,
        };
        let (bytes, weights): (Vec<Vec<u8>>, Vec<Vec<f64>>) =
            (0..rows).map(|r| encode(r, n_in)).unzip();
        let x = input(n_tok, n_in);
        let h = self
            .upload(ty, &bytes.concat(), n_in, rows)
            .map_err(|e| e.to_string())?;
        let y = self.with_prefill_frags(true, || {
            self.with_wide_tiles(wide, || {
                self.matmul_group_on(&[h], &x, n_tok, kernel, MatmulInput::F16)
            })
        });
        let freed = self.free(h);
        let y = y.map_err(|e| e.to_string())?;
        freed.map_err(|e| e.to_string())?;
        let y = y.concat();
        // The exact outputs of the distinct tokens only: the split check's
        // rows (8192 values) would otherwise cost ~0.1 s of host time at open.
        let exact: Vec<Vec<f64>> = (0..TOKEN_PERIOD.min(n_tok))
            .map(|t| {
                let xt = &x[t * n_in..(t + 1) * n_in];
                let dot = |w: &Vec<f64>| w.iter().zip(xt).map(|(&a, &b)| a * f64::from(b)).sum();
                weights.iter().map(dot).collect()
            })
            .collect();
        let mut first = None;
        let mut wrong = 0;
        for t in 0..n_tok {
            for (r, &want) in exact[t % TOKEN_PERIOD].iter().enumerate() {
                let got = f64::from(y[t * rows + r]);
                if got != want {
                    wrong += 1;
                    first.get_or_insert(format!("y[t={t}, r={r}] = {got}, exact {want}"));
                }
            }
        }
        let Some(first) = first else { return Ok(()) };
        let nan = y.iter().filter(|v| v.is_nan()).count();
        Err(format!(
            "{ty:?} wide={wide} n_in={n_in}: {first}; {wrong} of {} outputs differ, {nan} NaN",
            y.len()
        ))
    }
}
