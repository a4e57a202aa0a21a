//! The row stride of the shared-memory A/B tiles of the cooperative-matrix
//! matmul (shaders/matmul_coopmat.comp), and the shared-memory budget that
//! follows from it.
//!
//! A staged row holds f16 values two to a 32-bit word (a dword); the shader
//! indexes its tiles in dwords and the memory banks are one dword wide. A
//! fragment load reads one column of TM rows at once, so lane i touches bank
//! (stride * i) % banks: gcd(stride, banks) lanes share a bank. Measured
//! (docs/BENCHMARKS.md, seed 003): an odd stride is conflict-free by that
//! model yet three times slower, because rows at odd dword offsets lose the
//! wide (two-dword) load path. Hence the rule: keep the stride a multiple of
//! the wide load first, then minimise gcd(stride, banks).
//!
//! The alignment that comes first is 16 bytes (four dwords), not two: the
//! Vulkan specification requires the pointer and stride of a cooperative
//! matrix load or store to be aligned to the lesser of 16 bytes and one
//! matrix row (VUID-RuntimeSpirv-OpCooperativeMatrixLoadKHR-08986), which is
//! 16 bytes for 16-value f16 rows. An even stride of 18 dwords (72 bytes)
//! breaks that contract; drivers that exploit it for 16-byte loads misread
//! such tiles. So with 32 values per row the stride is 20 dwords (gcd 4).
//!
//! The stride is computed here and only here. Its result is both the
//! shader's specialisation constant and the input of the budget check, so
//! the two cannot disagree on units (the budget in bytes is 4 bytes per
//! dword, i.e. 2 bytes per f16 element of a padded row of 2 * stride elements).

/// Banks of shared memory (dword-wide) on the devices measured.
pub const SHARED_MEMORY_BANKS: u32 = 32;

/// Dwords the stride must stay a multiple of: 16 bytes, the alignment of a
/// cooperative matrix load (and the widest shared-memory load path).
pub const WIDE_LOAD_DWORDS: u32 = 4;

/// How a staged row is padded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PaddingRule {
    /// Shared-memory banks, each one dword wide.
    pub banks: u32,
    /// The stride must be a multiple of this many dwords (the wide load).
    pub load_dwords: u32,
}

impl Default for PaddingRule {
    fn default() -> PaddingRule {
        PaddingRule {
            banks: SHARED_MEMORY_BANKS,
            load_dwords: WIDE_LOAD_DWORDS,
        }
    }
}

/// The padded stride of one staged row, in dwords (the unit of the shader).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowStride {
    dwords: u32,
}

impl RowStride {
    /// Dwords from one staged row to the next (the shader's STRIDE).
    pub fn dwords(self) -> u32 {
        self.dwords
    }

    /// The same stride counted in f16 elements (two per dword).
    pub fn f16_elements(self) -> u32 {
        2 * self.dwords
    }

    /// The same stride in bytes.
    pub fn bytes(self) -> u32 {
        4 * self.dwords
    }
}

fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The stride of a staged row of `row_values` f16 values (an even count).
///
/// Candidates run from the unpadded row (row_values / 2 dwords) up to one
/// full round of banks more; among the multiples of `rule.load_dwords` the
/// one with the smallest gcd(stride, banks) wins, the shortest on ties. With
/// 32 banks and 32 values per row this gives 20 dwords (gcd 4) under the
/// default 16-byte alignment, not the 16 (gcd 16) of an unpadded row; with
/// a two-dword alignment it would give 18 (gcd 2), never an odd stride.
pub fn padded_row_stride(row_values: u32, rule: PaddingRule) -> RowStride {
    let base = row_values.div_ceil(2).max(1);
    let align = rule.load_dwords.max(1);
    let banks = rule.banks.max(1);
    let first = base.next_multiple_of(align);
    let best = (0..=banks.div_ceil(align))
        .map(|i| first + i * align)
        .min_by_key(|&s| (gcd(s, banks), s))
        .unwrap_or(first);
    RowStride { dwords: best }
}

/// Shared memory of one workgroup of the cooperative-matrix kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedLayout {
    /// Weight rows staged per step (BM, or twice that double-buffered).
    pub a_rows: u32,
    /// Token rows of x staged at once.
    pub b_rows: u32,
    /// The padded stride of the A rows.
    pub stride: RowStride,
    /// The padded stride of the B rows: the A stride where both hold one
    /// step, longer where x is staged in chunks of several steps.
    pub b_stride: RowStride,
    /// f32 values of the output staging (one fragment per subgroup).
    pub c_values: u32,
}

impl SharedLayout {
    /// Bytes the shader declares: the A and B tiles (dwords of padded rows)
    /// and the f32 output staging.
    pub fn bytes(&self) -> u32 {
        self.a_rows * self.stride.bytes() + self.b_rows * self.b_stride.bytes() + 4 * self.c_values
    }

    /// The layout's size when it fits in `max_bytes`
    /// (maxComputeSharedMemorySize), else an explanation.
    pub fn check(&self, max_bytes: u32) -> Result<u32, String> {
        let bytes = self.bytes();
        if bytes <= max_bytes {
            Ok(bytes)
        } else {
            Err(format!(
                "tiles of {} + {} rows at strides of {} / {} dwords need {bytes} bytes of shared memory, the device has {max_bytes}",
                self.a_rows,
                self.b_rows,
                self.stride.dwords(),
                self.b_stride.dwords()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVEN: PaddingRule = PaddingRule {
        banks: 32,
        load_dwords: 2,
    };

    #[test]
    fn thirty_two_values_get_a_16_byte_stride_with_the_smallest_bank_overlap() {
        let s = padded_row_stride(32, PaddingRule::default());
        assert_eq!(s.dwords(), 20);
        assert_eq!(s.bytes() % 16, 0);
        assert_eq!(gcd(s.dwords(), 32), 4);
        // Every other multiple of four dwords in reach overlaps more banks.
        for other in [16, 24, 28, 32, 36] {
            assert!(gcd(other, 32) > 4 || other > 20, "{other}");
        }
    }

    #[test]
    fn the_default_stride_is_16_byte_aligned_for_every_row_length() {
        for values in (2..=256).step_by(2) {
            let s = padded_row_stride(values, PaddingRule::default());
            assert_eq!(s.bytes() % 16, 0, "{values} values: {s:?}");
            assert!(s.f16_elements() >= values, "{values} values: {s:?}");
            assert_eq!(gcd(s.dwords(), 32), 4, "{values} values: {s:?}");
        }
    }

    #[test]
    fn with_two_dword_loads_thirty_two_values_get_18() {
        let s = padded_row_stride(32, EVEN);
        assert_eq!(s.dwords(), 18);
        assert_eq!(gcd(s.dwords(), 32), 2);
    }

    #[test]
    fn the_stride_is_never_odd_even_where_an_odd_one_has_no_conflicts() {
        let rule = EVEN;
        for values in (2..=256).step_by(2) {
            let s = padded_row_stride(values, rule).dwords();
            assert_eq!(s % 2, 0, "{values} values: stride {s}");
            assert!(s >= values / 2, "{values} values: stride {s} too short");
            // Among even strides the best achievable overlap with 32 banks is 2.
            assert_eq!(gcd(s, 32), 2, "{values} values: stride {s}");
            // And no shorter even stride reaches it.
            for shorter in (values / 2..s).filter(|c| c % 2 == 0) {
                assert!(gcd(shorter, 32) > 2, "{values}: {shorter} would do");
            }
        }
    }

    #[test]
    fn an_unpadded_row_is_kept_when_it_already_meets_the_rule() {
        // 36 values = 18 dwords: even, gcd 2; 40 values = 20 dwords.
        assert_eq!(padded_row_stride(36, EVEN).dwords(), 18);
        assert_eq!(padded_row_stride(40, PaddingRule::default()).dwords(), 20);
    }

    #[test]
    fn a_sixteen_dword_alignment_leaves_the_row_unpadded() {
        let rule = PaddingRule {
            banks: 32,
            load_dwords: 16,
        };
        assert_eq!(padded_row_stride(32, rule).dwords(), 16);
    }

    #[test]
    fn without_an_alignment_constraint_the_bank_model_alone_picks_odd() {
        let rule = PaddingRule {
            banks: 32,
            load_dwords: 1,
        };
        assert_eq!(padded_row_stride(32, rule).dwords(), 17);
    }

    #[test]
    fn the_stride_converts_between_dwords_elements_and_bytes() {
        let s = padded_row_stride(32, PaddingRule::default());
        assert_eq!(s.f16_elements(), 40);
        assert_eq!(s.bytes(), 80);
        // The pad is four dwords, i.e. eight f16 elements: counting the pad in
        // elements where the shader counts dwords would halve it.
        assert_eq!(s.dwords() - 32 / 2, 4);
        assert_eq!(s.f16_elements() - 32, 8);
    }

    #[test]
    fn the_budget_counts_padded_dwords_and_the_output_staging() {
        let layout = SharedLayout {
            a_rows: 128,
            b_rows: 128,
            stride: padded_row_stride(32, PaddingRule::default()),
            b_stride: padded_row_stride(32, PaddingRule::default()),
            c_values: 4 * 16 * 16,
        };
        // 256 rows x 20 dwords x 4 bytes + 1024 floats x 4 bytes.
        assert_eq!(layout.bytes(), 256 * 80 + 4096);
        assert_eq!(layout.bytes(), 24576);
        assert_eq!(layout.check(48 * 1024), Ok(24576));
        // Exactly full fits; one byte less does not.
        assert_eq!(layout.check(24576), Ok(24576));
        assert!(layout.check(24575).is_err());
        // An unpadded f16 tile would need 256 x 32 x 2 bytes: the pad of four
        // dwords per row costs 4 KiB. Counting that pad as four f16 elements
        // instead would undercount it by half.
        assert_eq!(layout.bytes() - 256 * 32 * 2 - 4096, 256 * 4 * 4);
        let pad_as_elements = 256 * (32 + 4) * 2 + 4096;
        assert!(pad_as_elements < layout.bytes());
    }

    #[test]
    fn a_chunked_x_tile_counts_its_own_stride() {
        // 64 A rows of 64 values (36 dwords) double-buffered, 16 token rows
        // of a 512-value x chunk (260 dwords), four output fragments.
        let layout = SharedLayout {
            a_rows: 2 * 64,
            b_rows: 16,
            stride: padded_row_stride(64, PaddingRule::default()),
            b_stride: padded_row_stride(512, PaddingRule::default()),
            c_values: 4 * 16 * 16,
        };
        assert_eq!(
            (layout.stride.dwords(), layout.b_stride.dwords()),
            (36, 260)
        );
        assert_eq!(layout.bytes(), 128 * 36 * 4 + 16 * 260 * 4 + 4 * 1024);
        let err = layout.check(16 * 1024).unwrap_err();
        assert!(err.contains("36 / 260 dwords"), "{err}");
    }

    #[test]
    fn a_tile_too_large_for_the_device_is_refused_with_its_size() {
        let layout = SharedLayout {
            a_rows: 256,
            b_rows: 256,
            stride: padded_row_stride(32, PaddingRule::default()),
            b_stride: padded_row_stride(32, PaddingRule::default()),
            c_values: 8 * 256,
        };
        let err = layout.check(32 * 1024).unwrap_err();
        assert!(err.contains(&layout.bytes().to_string()), "{err}");
    }
}
