// Weight groups split into a load and a decode, for the software-pipelined
// staging of matmul_coopmat.comp: raw_fetch issues the global loads of one
// group of 8 values (the words dequant8 of dequant.glsl reads) into
// registers, raw_decode turns them into the values later, after other work
// has hidden the load latency.
//
// raw_decode repeats dequant8's arithmetic operation for operation, so both
// stagings stage the same f16 values (the coopmat tests compare them bit for
// bit). Included after dequant.glsl, whose helpers and layouts it uses.
//
// Each type provides RAW_WORDS and
//     RawGroup raw_fetch(uint row_byte, uint g)
//     void raw_decode(RawGroup r, uint g, out vec4 lo, out vec4 hi)
// for values 8g .. 8g+7 of the row starting at byte row_byte.

// The weights as 8- and 16-byte words, for the K-quant fetches with
// WIDE_FETCH (a specialisation constant of the including shader): a Q4_K
// group's block head is one 16-byte load and its 8 quant bytes one 8-byte
// load (2 load instructions instead of 6; blocks and block bodies are
// multiples of 16 bytes and rows start on 16 bytes, common.glsl). On the
// H200 this took pp512 +15% (llama-8b) and cost the batch tile ~10%, which
// keeps 4-byte loads.
layout(std430, binding = 0) readonly buffer RawWeights2 { uvec2 raw_w2[]; };
layout(std430, binding = 0) readonly buffer RawWeights4 { uvec4 raw_w4[]; };

// The 16 bytes at byte_addr (16-byte aligned): one load with WIDE_FETCH,
// else four 4-byte loads.
uvec4 fetch16(uint byte_addr) {
    if (WIDE_FETCH != 0u) {
        return raw_w4[byte_addr >> 4];
    }
    uint i = byte_addr >> 2;
    return uvec4(w[i], w[i + 1u], w[i + 2u], w[i + 3u]);
}

// The 8 bytes at byte_addr (8-byte aligned): one load with WIDE_FETCH, else two.
uvec2 fetch8(uint byte_addr) {
    if (WIDE_FETCH != 0u) {
        return raw_w2[byte_addr >> 3];
    }
    uint i = byte_addr >> 2;
    return uvec2(w[i], w[i + 1u]);
}

// Byte `byte_addr & 3` of `word` (the word holding byte_addr).
uint byte_in(uint word, uint byte_addr) {
    return (word >> ((byte_addr & 3u) * 8u)) & 0xffu;
}

// The f16 at an even byte address, from the word holding it (as load_f16).
float f16_in(uint word, uint byte_addr) {
    return unpackHalf2x16((word >> ((byte_addr & 2u) * 8u)) & 0xffffu).x;
}

#if defined(TYPE_F32)
#define RAW_WORDS 8u
#elif defined(TYPE_F16)
#define RAW_WORDS 4u
#elif defined(TYPE_Q4_0) || defined(TYPE_Q4_1) || defined(TYPE_Q8_0)
#define RAW_WORDS 3u
#elif defined(TYPE_Q5_0) || defined(TYPE_Q5_1)
#define RAW_WORDS 4u
#elif defined(TYPE_Q4_K) || defined(TYPE_Q6_K) || defined(TYPE_FQ3)
#define RAW_WORDS 6u
#elif defined(TYPE_Q5_K)
#define RAW_WORDS 8u
#endif

struct RawGroup {
    uint v[RAW_WORDS];
};

#if defined(TYPE_F32)
RawGroup raw_fetch(uint row_byte, uint g) {
    RawGroup r;
    uint i = (row_byte + g * BLOCK_BYTES) >> 2;
    for (uint j = 0u; j < 8u; j++) {
        r.v[j] = w[i + j];
    }
    return r;
}

void raw_decode(RawGroup r, uint g, out vec4 lo, out vec4 hi) {
    lo = uintBitsToFloat(uvec4(r.v[0], r.v[1], r.v[2], r.v[3]));
    hi = uintBitsToFloat(uvec4(r.v[4], r.v[5], r.v[6], r.v[7]));
}

#elif defined(TYPE_F16)
RawGroup raw_fetch(uint row_byte, uint g) {
    RawGroup r;
    uint i = (row_byte + g * BLOCK_BYTES) >> 2;
    for (uint j = 0u; j < 4u; j++) {
        r.v[j] = w[i + j];
    }
    return r;
}

void raw_decode(RawGroup r, uint g, out vec4 lo, out vec4 hi) {
    lo = vec4(unpackHalf2x16(r.v[0]), unpackHalf2x16(r.v[1]));
    hi = vec4(unpackHalf2x16(r.v[2]), unpackHalf2x16(r.v[3]));
}

#elif defined(TYPE_Q4_0) || defined(TYPE_Q4_1)
// v: the scale word (Q4_0: the word holding d; Q4_1: (d, m)), two qs words.
RawGroup raw_fetch(uint row_byte, uint g) {
    RawGroup r;
    uint blk = g / GROUPS_PER_BLOCK;
    uint k = g - blk * GROUPS_PER_BLOCK;
#if defined(TYPE_Q4_0)
    r.v[0] = w[(row_byte + 16u * blocks_per_row() + 2u * blk) >> 2];
#else
    r.v[0] = w[(row_byte + 16u * blocks_per_row()) / 4u + blk];
#endif
    uint q = (row_byte + 16u * blk) / 4u + (k & 1u) * 2u;
    r.v[1] = w[q];
    r.v[2] = w[q + 1u];
    return r;
}

void raw_decode(RawGroup r, uint g, out vec4 lo, out vec4 hi) {
    uint blk = g / GROUPS_PER_BLOCK;
    uint k = g - blk * GROUPS_PER_BLOCK;
    uint a = r.v[1];
    uint b = r.v[2];
    if (k >= 2u) {
        a >>= 4;
        b >>= 4;
    }
#if defined(TYPE_Q4_0)
    // Rows start 16-byte aligned, so the f16's place in its word follows blk.
    float d = f16_in(r.v[0], 2u * blk);
    lo = d * (bytes4(a & 0x0f0f0f0fu) - 8.0);
    hi = d * (bytes4(b & 0x0f0f0f0fu) - 8.0);
#else
    vec2 dm = unpackHalf2x16(r.v[0]);
    lo = dm.x * bytes4(a & 0x0f0f0f0fu) + dm.y;
    hi = dm.x * bytes4(b & 0x0f0f0f0fu) + dm.y;
#endif
}

#elif defined(TYPE_Q5_0) || defined(TYPE_Q5_1)
// v: qh', two qs words, the scale word (Q5_0: holding d; Q5_1: (d, m)).
RawGroup raw_fetch(uint row_byte, uint g) {
    RawGroup r;
    uint blk = g / GROUPS_PER_BLOCK;
    uint k = g - blk * GROUPS_PER_BLOCK;
    uint nb = blocks_per_row();
    r.v[0] = w[(row_byte + 16u * nb) / 4u + blk];
    uint q = (row_byte + 16u * blk) / 4u + (k & 1u) * 2u;
    r.v[1] = w[q];
    r.v[2] = w[q + 1u];
#if defined(TYPE_Q5_0)
    r.v[3] = w[(row_byte + 20u * nb + 2u * blk) >> 2];
#else
    r.v[3] = w[(row_byte + 20u * nb) / 4u + blk];
#endif
    return r;
}

void raw_decode(RawGroup r, uint g, out vec4 lo, out vec4 hi) {
    uint blk = g / GROUPS_PER_BLOCK;
    uint k = g - blk * GROUPS_PER_BLOCK;
    uint qh = r.v[0];
    uint c = (k & 1u) * 2u;
    uint a = r.v[1];
    uint b = r.v[2];
    if (k >= 2u) {
        a = ((a >> 4) & 0x0f0f0f0fu) | qh5_hi(qh, c);
        b = ((b >> 4) & 0x0f0f0f0fu) | qh5_hi(qh, c + 1u);
    } else {
        a = (a & 0x0f0f0f0fu) | qh5_lo(qh, c);
        b = (b & 0x0f0f0f0fu) | qh5_lo(qh, c + 1u);
    }
#if defined(TYPE_Q5_0)
    float d = f16_in(r.v[3], 2u * blk);
    lo = d * (bytes4(a) - 16.0);
    hi = d * (bytes4(b) - 16.0);
#else
    vec2 dm = unpackHalf2x16(r.v[3]);
    lo = dm.x * bytes4(a) + dm.y;
    hi = dm.x * bytes4(b) + dm.y;
#endif
}

#elif defined(TYPE_Q8_0)
// v: the word holding d, two qs words.
RawGroup raw_fetch(uint row_byte, uint g) {
    RawGroup r;
    uint blk = g / GROUPS_PER_BLOCK;
    uint k = g - blk * GROUPS_PER_BLOCK;
    r.v[0] = w[(row_byte + 32u * blocks_per_row() + 2u * blk) >> 2];
    uint q = (row_byte + 32u * blk) / 4u + 2u * k;
    r.v[1] = w[q];
    r.v[2] = w[q + 1u];
    return r;
}

void raw_decode(RawGroup r, uint g, out vec4 lo, out vec4 hi) {
    uint blk = g / GROUPS_PER_BLOCK;
    float d = f16_in(r.v[0], 2u * blk);
    lo = d * sbytes4(r.v[1]);
    hi = d * sbytes4(r.v[2]);
}

#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
// v: (d, dmin), the three scale words, two qs words (Q5_K: two qh words).
// Blocks are 144 / 176 bytes, so every field starts on a word.
RawGroup raw_fetch(uint row_byte, uint g) {
    RawGroup r;
    uint blk = g / GROUPS_PER_BLOCK;
    uint k = g - blk * GROUPS_PER_BLOCK;
    uint block_byte = row_byte + blk * BLOCK_BYTES;
    uint c = k >> 3;
    uint l0 = (k & 3u) * 8u;
    uvec4 head = fetch16(block_byte);
    uvec2 q = fetch8(block_byte + QS_OFFSET + 32u * c + l0);
    r.v[0] = head.x;
    r.v[1] = head.y;
    r.v[2] = head.z;
    r.v[3] = head.w;
    r.v[4] = q.x;
    r.v[5] = q.y;
#if defined(TYPE_Q5_K)
    uvec2 qh = fetch8(block_byte + QH_OFFSET + l0);
    r.v[6] = qh.x;
    r.v[7] = qh.y;
#endif
    return r;
}

void raw_decode(RawGroup r, uint g, out vec4 lo, out vec4 hi) {
    uint blk = g / GROUPS_PER_BLOCK;
    uint k = g - blk * GROUPS_PER_BLOCK;
    vec2 dd = unpackHalf2x16(r.v[0]);
    uint c = k >> 3;
    uint h = (k >> 2) & 1u;
    uint j = 2u * c + h;
    vec2 sm = scale_min_k4_words(uvec3(r.v[1], r.v[2], r.v[3]), j);
    float scale = dd.x * sm.x;
    float minv = dd.y * sm.y;
    uint a = (r.v[4] >> (4u * h)) & 0x0f0f0f0fu;
    uint b = (r.v[5] >> (4u * h)) & 0x0f0f0f0fu;
#if defined(TYPE_Q5_K)
    a |= ((r.v[6] >> j) & 0x01010101u) << 4;
    b |= ((r.v[7] >> j) & 0x01010101u) << 4;
#endif
    lo = scale * bytes4(a) - minv;
    hi = scale * bytes4(b) - minv;
}

#elif defined(TYPE_Q6_K)
// Where group g of a Q6_K row lies (also coopmat_runs.glsl's runs): its
// block's body (208 bytes, so it starts on a word), half n, quarter qq,
// first value l0 within the quarter, and the word holding the block's d.
struct Q6Group {
    uint block_byte;
    uint n;
    uint qq;
    uint l0;
    uint d_word;
};

Q6Group q6_group(uint row_byte, uint g) {
    Q6Group q;
    uint blk = g / GROUPS_PER_BLOCK;
    uint k = g - blk * GROUPS_PER_BLOCK;
    q.block_byte = row_byte + blk * Q6_BODY_BYTES;
    q.n = k >> 4;
    q.qq = (k >> 2) & 3u;
    q.l0 = (k & 3u) * 8u;
    q.d_word = w[(row_byte + Q6_BODY_BYTES * blocks_per_row() + 2u * blk) >> 2];
    return q;
}

// v: the word holding d, two ql words, two qh words, the word holding the
// group's scale byte.
RawGroup raw_fetch(uint row_byte, uint g) {
    RawGroup r;
    Q6Group q = q6_group(row_byte, g);
    r.v[0] = q.d_word;
    uvec2 ql = fetch8(q.block_byte + 64u * q.n + 32u * (q.qq & 1u) + q.l0);
    uvec2 qh = fetch8(q.block_byte + 128u + 32u * q.n + q.l0);
    r.v[1] = ql.x;
    r.v[2] = ql.y;
    r.v[3] = qh.x;
    r.v[4] = qh.y;
    r.v[5] = w[(q.block_byte + 192u + 8u * q.n + (q.l0 >> 4) + 2u * q.qq) >> 2];
    return r;
}

void raw_decode(RawGroup r, uint g, out vec4 lo, out vec4 hi) {
    uint blk = g / GROUPS_PER_BLOCK;
    uint k = g - blk * GROUPS_PER_BLOCK;
    float d = f16_in(r.v[0], 2u * blk);
    uint qq = (k >> 2) & 3u;
    uint l0 = (k & 3u) * 8u;
    uint shift = (qq >> 1) * 4u;
    uint a = (r.v[1] >> shift) & 0x0f0f0f0fu;
    uint b = (r.v[2] >> shift) & 0x0f0f0f0fu;
    a |= ((r.v[3] >> (2u * qq)) & 0x03030303u) << 4;
    b |= ((r.v[4] >> (2u * qq)) & 0x03030303u) << 4;
    // The scale byte's place in its word: 192 and 8n keep the word alignment.
    uint sc_byte = byte_in(r.v[5], (l0 >> 4) + 2u * qq);
    float scale = d * sbyte_float(sc_byte);
    lo = scale * (bytes4(a) - 32.0);
    hi = scale * (bytes4(b) - 32.0);
}

#elif defined(TYPE_FQ3)
// v: the low plane word (A or B), the C word, the head's (d, dmin) and its
// three scale words.
RawGroup raw_fetch(uint row_byte, uint g) {
    RawGroup r;
    uint blk = g / GROUPS_PER_BLOCK;
    uint k = g - blk * GROUPS_PER_BLOCK;
    uint nb = blocks_per_row();
    uint gg = k >> 2;
    uint s = 2u * (k & 3u);
    uint a_word = row_byte / 4u + 8u * blk + gg;
    r.v[0] = w[a_word + (s < 4u ? 0u : 8u * nb)];
    r.v[1] = w[a_word + 16u * nb];
    uint head_word = (row_byte + 96u * nb + 16u * blk) >> 2;
    r.v[2] = w[head_word];
    r.v[3] = w[head_word + 1u];
    r.v[4] = w[head_word + 2u];
    r.v[5] = w[head_word + 3u];
    return r;
}

void raw_decode(RawGroup r, uint g, out vec4 lo, out vec4 hi) {
    uint blk = g / GROUPS_PER_BLOCK;
    uint k = g - blk * GROUPS_PER_BLOCK;
    uint gg = k >> 2;
    uint s = 2u * (k & 3u);
    vec2 dd = unpackHalf2x16(r.v[2]);
    vec2 sm = scale_min_k4_words(uvec3(r.v[3], r.v[4], r.v[5]), gg);
    float scale = dd.x * sm.x;
    float minv = dd.y * sm.y;
    lo = scale * bytes4(fq3_codes(r.v[0], r.v[1], s)) - minv;
    hi = scale * bytes4(fq3_codes(r.v[0], r.v[1], s + 1u)) - minv;
}
#endif
