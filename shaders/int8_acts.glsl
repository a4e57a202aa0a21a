// The layout of activations quantised once for every int8 matvec that reads
// them (span_rmsnorm.comp writes it, matvec_i8.comp with X_PREQUANTISED
// reads it). Per token, in 16-byte words: the int8 quants (n / 16 words),
// then the scale d = max|x| / 127 of each 32 values (n / 32 floats, padded
// to whole words), then d * (sum of quants) of each 16 values (n / 16
// floats, padded). crates/fish-vk/src/int8_dot.rs computes the same sizes.

uint int8_quant_vec4s(uint n) { return n / 16u; }
uint int8_scale_vec4s(uint n) { return (n / 32u + 3u) / 4u; }
uint int8_sum_vec4s(uint n) { return (n / 16u + 3u) / 4u; }
uint int8_token_vec4s(uint n) {
    return int8_quant_vec4s(n) + int8_scale_vec4s(n) + int8_sum_vec4s(n);
}
