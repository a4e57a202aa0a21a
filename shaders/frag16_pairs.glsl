// The f16 weight pairs of Q4_K and Q6_K code words that build the A
// fragments of frag16.glsl (values (0, 2) and (1, 3) of four codes, the
// column pairs an invocation holds). Included after frag16.glsl.

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
#elif defined(TYPE_Q6_K)
// Weight pairs of one word of six-bit codes (code bytes 0..63): values
// (0, 2) and (1, 3) as (code - 32) * scale.
void q6_pairs(uint code, H2 scale, out H2 p02, out H2 p13) {
    H2 lo = h2_bits((code & 0x00FF00FFu) | F16_1024) - H2(1056.0);
    H2 hi = h2_bits(((code >> 8) & 0x00FF00FFu) | F16_1024) - H2(1056.0);
    p02 = h2_round(lo * scale);
    p13 = h2_round(hi * scale);
}
#endif
