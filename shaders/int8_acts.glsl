// The layout of activations quantised once for every int8 matvec that reads
// them (span_rmsnorm.comp writes it, matvec_i8.comp with X_PREQUANTISED
// reads it). Per token, in 16-byte words: the int8 quants (n / 16 words),
// then the scale d = max|x| / 127 of each 32 values (n / 32 floats, padded
// to whole words), then d * (sum of quants) of each 16 values (n / 16
// floats, padded). crates/fish-vk/src/int8_dot.rs computes the same sizes.
// Included once per module: the writers a module needs are defined before
// its first include.
#if !defined(INT8_ACTS_GLSL)
#define INT8_ACTS_GLSL 1

uint int8_quant_vec4s(uint n) { return n / 16u; }
uint int8_scale_vec4s(uint n) { return (n / 32u + 3u) / 4u; }
uint int8_sum_vec4s(uint n) { return (n / 16u + 3u) / 4u; }
uint int8_token_vec4s(uint n) {
    return int8_quant_vec4s(n) + int8_scale_vec4s(n) + int8_sum_vec4s(n);
}
// Where row `row`'s scales and its sums start, in 16-byte words.
uint int8_scales_vec4(uint row, uint n) {
    return row * int8_token_vec4s(n) + int8_quant_vec4s(n);
}
uint int8_sums_vec4(uint row, uint n) {
    return int8_scales_vec4(row, n) + int8_scale_vec4s(n);
}

// The arithmetic every writer of the layout shares, so that they all round
// alike: the largest |value| of four, the inverse step of a block whose
// largest |value| is amax (its scale d = amax / 127), four values' quants
// at that step, and four quants packed as bytes.
float max_abs4(vec4 v) {
    vec4 a = abs(v);
    return max(max(a.x, a.y), max(a.z, a.w));
}
float inverse_step(float amax) {
    return amax > 0.0 ? 127.0 / amax : 0.0;
}
ivec4 quants4(vec4 v, float id) {
    return ivec4(round(v * id));
}
uint pack_quants(ivec4 q) {
    uvec4 b = uvec4(q) & 0xFFu;
    return b.x | (b.y << 8) | (b.z << 16) | (b.w << 24);
}
int sum4(ivec4 q) {
    return (q.x + q.y) + (q.z + q.w);
}

#if defined(INT8_WRITER)
// Writes block `blk` (32 values, v) of row `row` of rows of n values into
// q8 (a uint buffer the including shader declares): d = max|v| / 127, the
// quants round(v / d), d * (sum of quants) per 16. int8_dot.rs computes
// the same on the host.
void store_int8_block(vec4 v[8], uint row, uint blk, uint n) {
    uint base = 4u * row * int8_token_vec4s(n);
    uint scales = 4u * int8_scales_vec4(row, n);
    uint sums = 4u * int8_sums_vec4(row, n);
    float amax = 0.0;
    for (uint k = 0u; k < 8u; k++) {
        amax = max(amax, max_abs4(v[k]));
    }
    float d = amax / 127.0;
    float id = inverse_step(amax);
    int sum[2] = int[2](0, 0);
    for (uint k = 0u; k < 8u; k++) {
        ivec4 q = quants4(v[k], id);
        sum[k / 4u] += sum4(q);
        q8[base + 8u * blk + k] = pack_quants(q);
    }
    q8[scales + blk] = floatBitsToUint(d);
    q8[sums + 2u * blk] = floatBitsToUint(d * float(sum[0]));
    q8[sums + 2u * blk + 1u] = floatBitsToUint(d * float(sum[1]));
}
#endif

#if defined(INT8_PARTS_WRITER) || defined(INT8_PARTS)
// One block quantised by eight invocations, four values (v) each:
// invocation 8m + k of the workgroup holds part k (values 4k .. 4k + 3) of
// its block. They meet in part_max and part_sum (shared, one slot per
// invocation, declared by the including shader) for the block's max and
// sums, which store_int8_block computes alike. Returns the part's four
// quants packed (`word`), the block's scale (`d`) and, in parts 0 and 4,
// d * (sum of the quants of their 16 values) (`half_sum`; 0 elsewhere).
// Every invocation must call it (barriers); those without a block pass v
// zero. The slots are free again after a barrier.
#if defined(QUANT_IN_SUBGROUP)
// The same block met through lane shuffles instead of shared memory: the
// eight parts of a block are eight consecutive invocations, so eight
// neighbouring lanes of one subgroup (the host requires subgroup shuffles
// and subgroups of at least eight; invocations fill a workgroup's
// subgroups in order, as the matvec slices' subgroup reductions assume
// too). Max and integer sums are exact in any order, so the bits are those
// of the shared-memory form; no barrier, no slots.
void quantise_part(vec4 v, out uint word, out float d, out float half_sum) {
    uint part = gl_LocalInvocationID.x % 8u;
    float amax = max_abs4(v);
    amax = max(amax, subgroupShuffleXor(amax, 1u));
    amax = max(amax, subgroupShuffleXor(amax, 2u));
    amax = max(amax, subgroupShuffleXor(amax, 4u));
    d = amax / 127.0;
    ivec4 q = quants4(v, inverse_step(amax));
    int sum = sum4(q);
    sum += subgroupShuffleXor(sum, 1u);
    sum += subgroupShuffleXor(sum, 2u);
    word = pack_quants(q);
    half_sum = part % 4u == 0u ? d * float(sum) : 0.0;
}
#else
void quantise_part(vec4 v, out uint word, out float d, out float half_sum) {
    uint tid = gl_LocalInvocationID.x;
    uint part = tid % 8u;
    part_max[tid] = max_abs4(v);
    barrier();
    float amax = 0.0;
    for (uint k = 0u; k < 8u; k++) {
        amax = max(amax, part_max[tid - part + k]);
    }
    d = amax / 127.0;
    ivec4 q = quants4(v, inverse_step(amax));
    part_sum[tid] = sum4(q);
    barrier();
    word = pack_quants(q);
    half_sum = 0.0;
    if (part % 4u == 0u) {
        int sum = (part_sum[tid] + part_sum[tid + 1u]) + (part_sum[tid + 2u] + part_sum[tid + 3u]);
        half_sum = d * float(sum);
    }
}
#endif
#endif

#if defined(INT8_PARTS_WRITER)
// Part w % 8 of block w / 8 of the quantised vector of n values whose
// layout starts at word `base` of q8: its four quants (`word`), the
// block's scale d (part 0) and d * (sum of the quants of its 16 values)
// (parts 0 and 4), as quantise_part returns them.
void store_int8_word(uint base, uint n, uint w, uint word, float d, float half_sum) {
    uint blk = w / 8u;
    uint part = w % 8u;
    q8[base + w] = word;
    if (part == 0u) {
        q8[base + 4u * int8_quant_vec4s(n) + blk] = floatBitsToUint(d);
    }
    if (part % 4u == 0u) {
        q8[base + 4u * (int8_quant_vec4s(n) + int8_scale_vec4s(n)) + 2u * blk + part / 4u] =
            floatBitsToUint(half_sum);
    }
}

// quantise_part's block written into q8: part `tid % 8` of block `blk` of
// row `row` (rows of n values). Every invocation must call it (barriers);
// those with `write` false only lend their slot (v zero).
void store_int8_part(vec4 v, bool write, uint row, uint blk, uint n) {
    uint word;
    float d;
    float half_sum;
    quantise_part(v, word, d, half_sum);
    if (write) {
        uint w = 8u * blk + gl_LocalInvocationID.x % 8u;
        store_int8_word(4u * row * int8_token_vec4s(n), n, w, word, d, half_sum);
    }
}
#endif
#endif
