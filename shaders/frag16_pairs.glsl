// The f16 weight pairs of Q4_K and Q6_K code words that build the A
// fragments of frag16.glsl: values (0, 2) and (1, 3) of four codes, the
// column pairs an invocation holds where its x pairs are built the same way
// (x_pairs, the batched decode), or values (0, 1) and (2, 3) (`_adjacent`,
// the prefill kernel), where each 32-bit word of f16 x, two adjacent values
// as they lie in memory, is a register of the B fragment as loaded: the
// weight side then does the pairing, once per A fragment, instead of the
// x side once per B fragment (defined where PAIRS_ADJACENT is). Included
// after frag16.glsl.

#if defined(PAIRS_ADJACENT)
// The pattern of F16_1024 for fields at bits 4..9 read as 64 + a: the
// exponent of 64 has steps of 1/16, so bit 4 is a unit.
const uint F16_64 = 0x54005400u;
// Bytes 0 and 1 of w at bits 0 and 16 (bytes01); bytes 2 and 3 likewise.
uint bytes01(uint w) {
    return (w & 0xFFu) | ((w << 8) & 0x00FF0000u);
}
uint bytes23(uint w) {
    return ((w >> 16) & 0xFFu) | ((w >> 8) & 0x00FF0000u);
}
#endif

#if defined(TYPE_Q4_K)
// Weight pairs of one word of codes (nibbles at bit `shift` of each byte):
// values (0, 2) and (1, 3) as q * scale - minv, q read exactly from the
// f16 pattern 1024 + q.
void q4_pairs(uint word, uint shift, H2 scale, H2 minv, out H2 p02, out H2 p13) {
    uint ws = word >> shift;
    H2 lo = h2_bits((ws & 0x000F000Fu) | F16_1024) - H2(1024.0);
    H2 hi = h2_bits(((ws >> 8) & 0x000F000Fu) | F16_1024) - H2(1024.0);
    p02 = h2_round(fma(lo, scale, -minv));
    p13 = h2_round(fma(hi, scale, -minv));
}

#if defined(PAIRS_ADJACENT)
// Values (0, 1) and (2, 3) of the same codes (see the top of this file),
// the low nibbles (hn 0) or the high ones (hn 1) of the word. The bytes
// are paired before the nibble is chosen, so that both halves share the
// pairing, and the high nibbles are read in place: at bits 4..7 of an f16
// with the exponent of 64, whose steps are 1/16, a field counts units, so
// the pattern reads 64 + q with no shift.
void q4_pairs_adjacent(uint word, uint hn, H2 scale, H2 minv, out H2 p01, out H2 p23) {
    uint mask = hn == 0u ? 0x000F000Fu : 0x00F000F0u;
    uint bias = hn == 0u ? F16_1024 : F16_64;
    H2 offset = H2(hn == 0u ? 1024.0 : 64.0);
    H2 lo = h2_bits((bytes01(word) & mask) | bias) - offset;
    H2 hi = h2_bits((bytes23(word) & mask) | bias) - offset;
    p01 = h2_round(fma(lo, scale, -minv));
    p23 = h2_round(fma(hi, scale, -minv));
}
#endif
#elif defined(TYPE_Q6_K)
// Weight pairs of one word of six-bit codes (code bytes 0..63): values
// (0, 2) and (1, 3) as (code - 32) * scale.
void q6_pairs(uint code, H2 scale, out H2 p02, out H2 p13) {
    H2 lo = h2_bits((code & 0x00FF00FFu) | F16_1024) - H2(1056.0);
    H2 hi = h2_bits(((code >> 8) & 0x00FF00FFu) | F16_1024) - H2(1056.0);
    p02 = h2_round(lo * scale);
    p13 = h2_round(hi * scale);
}

#if defined(PAIRS_ADJACENT)
// Values (0, 1) and (2, 3) of the six-bit codes of quarter qq (0..3) of a
// word of low bits (ql: the quarter's nibble, low for qq < 2, high
// otherwise) and a word of high bits (qh: two bits per quarter at bit
// 2 qq), as (code - 32) * scale. Both words are paired before the quarter
// is chosen (the pairing is shared by the quarters that read the word), the
// high bits are moved next to the nibble with one shift, and quarters 2 and
// 3 are read in place at bits 4..9 of an f16 with the exponent of 64 (see
// q4_pairs_adjacent).
void q6_pairs_adjacent(uint ql, uint qh, uint qq, H2 scale, out H2 p01, out H2 p23) {
    bool low = qq < 2u;
    uint lmask = low ? 0x000F000Fu : 0x00F000F0u;
    uint hmask = low ? 0x00300030u : 0x03000300u;
    uint bias = low ? F16_1024 : F16_64;
    uint shift = (qq & 1u) == 0u ? 4u : 2u;
    H2 offset = H2(low ? 1056.0 : 96.0);
    H2 lo = h2_bits((bytes01(ql) & lmask) | ((bytes01(qh) << shift) & hmask) | bias) - offset;
    H2 hi = h2_bits((bytes23(ql) & lmask) | ((bytes23(qh) << shift) & hmask) | bias) - offset;
    p01 = h2_round(lo * scale);
    p23 = h2_round(hi * scale);
}
#endif
#endif
