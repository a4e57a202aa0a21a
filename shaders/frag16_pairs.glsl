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
// Values (0, 1) and (2, 3) of the same codes (see the top of this file).
void q4_pairs_adjacent(uint word, uint shift, H2 scale, H2 minv, out H2 p01, out H2 p23) {
    uint ws = word >> shift;
    H2 lo = h2_bits((bytes01(ws) & 0x000F000Fu) | F16_1024) - H2(1024.0);
    H2 hi = h2_bits((bytes23(ws) & 0x000F000Fu) | F16_1024) - H2(1024.0);
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
// Values (0, 1) and (2, 3) of the same codes (see the top of this file).
void q6_pairs_adjacent(uint code, H2 scale, out H2 p01, out H2 p23) {
    H2 lo = h2_bits(bytes01(code) | F16_1024) - H2(1056.0);
    H2 hi = h2_bits(bytes23(code) | F16_1024) - H2(1056.0);
    p01 = h2_round(lo * scale);
    p23 = h2_round(hi * scale);
}
#endif
#endif
