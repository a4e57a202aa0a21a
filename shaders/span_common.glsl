// Shared by the span kernels: f16 access to the KV cache, which is bound as
// uint[] with two f16 values per word so that no 16-bit storage feature is
// needed.

float kv_load(uint word, uint e) {
    vec2 pair = unpackHalf2x16(word);
    return (e & 1u) == 0u ? pair.x : pair.y;
}
