//! The 12-byte packing of eight 6-bit scales and eight 6-bit mins shared by
//! Q4_K, Q5_K and FQ3.
//!
//! Bytes 0..4 hold scales 0..3 in their low six bits, bytes 4..8 mins 0..3;
//! bytes 8..12 hold the low nibbles of scale j (low) and min j (high) for
//! j = 4..7, whose top two bits live in the spare top bits of bytes 0..8.

/// Scale and min of group `j` (0..8).
#[inline(always)]
pub fn get(packed: &[u8; 12], j: usize) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        (
            (packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4),
            (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
        )
    }
}

/// Packs eight 6-bit scales and mins (each `< 64`).
pub fn pack(scales: &[u8; 8], mins: &[u8; 8]) -> [u8; 12] {
    let mut p = [0u8; 12];
    for j in 0..8 {
        let (s, m) = (scales[j] & 63, mins[j] & 63);
        if j < 4 {
            p[j] |= s;
            p[j + 4] |= m;
        } else {
            p[j + 4] = (s & 0x0f) | ((m & 0x0f) << 4);
            p[j - 4] |= (s >> 4) << 6;
            p[j] |= (m >> 4) << 6;
        }
    }
    p
}

/// All eight (scale, min) pairs.
#[inline(always)]
pub fn unpack(packed: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut s = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        (s[j], m[j]) = get(packed, j);
    }
    (s, m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_unpack_round_trips_all_six_bit_values() {
        for base in 0..64usize {
            let s: [u8; 8] = std::array::from_fn(|j| ((base + 7 * j) % 64) as u8);
            let m: [u8; 8] = std::array::from_fn(|j| ((base * 3 + 11 * j) % 64) as u8);
            assert_eq!(unpack(&pack(&s, &m)), (s, m));
        }
    }

    #[test]
    fn layout_of_high_groups() {
        // Scale 4 = 0b110101, min 4 = 0b101011.
        let mut s = [0u8; 8];
        let mut m = [0u8; 8];
        s[4] = 0b110101;
        m[4] = 0b101011;
        let p = pack(&s, &m);
        assert_eq!(p[8], 0b1011_0101);
        assert_eq!(p[0] >> 6, 0b11);
        assert_eq!(p[4] >> 6, 0b10);
    }
}
