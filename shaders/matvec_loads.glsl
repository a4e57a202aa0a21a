// The unit loads of the matvec kernels (the Unit layouts and their decoding
// are in matvec_units.glsl, which includes this file for binding 0).
// Written over macro names so that one kernel can load units from two
// weight buffers: the gate/up matvec (matvec.comp GATE_UP) includes it a
// second time for its up weights.
//   LOAD_UNIT     the function's name
//   LOAD_WORDS4   the weights as uvec4[]
//   LOAD_WORDS    the same weights as uint[]
// A unit's f16 scale is half of one word, as dequant.glsl's load_f16 reads
// it from binding 0.
#define LOAD_F16_AT(byte_addr) unpackHalf2x16((LOAD_WORDS[(byte_addr) >> 2] >> (((byte_addr) & 2u) * 8u)) & 0xffffu).x

#if defined(TYPE_F32) || defined(TYPE_F16)
// A unit of 32 values: 8 16-byte words of f32, 4 of f16.
Unit LOAD_UNIT(uint row_byte, uint u) {
    Unit un;
    const uint words = uint(un.v.length());
    uint i = row_byte / 16u + words * u;
    for (uint k = 0u; k < words; k++) {
        un.v[k] = LOAD_WORDS4[i + k];
    }
    return un;
}

#elif defined(TYPE_Q4_0) || defined(TYPE_Q4_1)
Unit LOAD_UNIT(uint row_byte, uint u) {
    Unit un;
    un.qs = LOAD_WORDS4[row_byte / 16u + u];
#if defined(TYPE_Q4_0)
    un.dm = vec2(LOAD_F16_AT(row_byte + 16u * blocks_per_row() + 2u * u), 0.0);
#else
    un.dm = unpackHalf2x16(LOAD_WORDS[(row_byte + 16u * blocks_per_row()) / 4u + u]);
#endif
    return un;
}

#elif defined(TYPE_Q5_0) || defined(TYPE_Q5_1)
Unit LOAD_UNIT(uint row_byte, uint u) {
    Unit un;
    uint nb = blocks_per_row();
    un.qs = LOAD_WORDS4[row_byte / 16u + u];
    un.qh = LOAD_WORDS[(row_byte + 16u * nb) / 4u + u];
#if defined(TYPE_Q5_0)
    un.dm = vec2(LOAD_F16_AT(row_byte + 20u * nb + 2u * u), 0.0);
#else
    un.dm = unpackHalf2x16(LOAD_WORDS[(row_byte + 20u * nb) / 4u + u]);
#endif
    return un;
}

#elif defined(TYPE_Q8_0)
Unit LOAD_UNIT(uint row_byte, uint u) {
    Unit un;
    un.q[0] = LOAD_WORDS4[row_byte / 16u + 2u * u];
    un.q[1] = LOAD_WORDS4[row_byte / 16u + 2u * u + 1u];
    un.d = LOAD_F16_AT(row_byte + 32u * blocks_per_row() + 2u * u);
    return un;
}

#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
Unit LOAD_UNIT(uint row_byte, uint u) {
    Unit un;
    uint sb = u / 8u;
    uint v = u % 8u;
    uint block16 = (row_byte + sb * BLOCK_BYTES) / 16u;
    un.head = LOAD_WORDS4[block16];
    un.qs = LOAD_WORDS4[block16 + QS_OFFSET / 16u + v];
#if defined(TYPE_Q5_K)
    un.qh = LOAD_WORDS4[block16 + QH_OFFSET / 16u + (v & 1u)];
#endif
    un.c = v / 2u;
    return un;
}

#if defined(TOUCH_UNIT)
// One word of each 32-byte sector of the unit's 16-byte loads (the head and
// qs; Q5_K's qh too), each of which lies inside one sector: the touch of
// the normed kernels' first round (matvec_i8.comp TOUCH_ROWS).
uint TOUCH_UNIT(uint row_byte, uint u) {
    uint sb = u / 8u;
    uint v = u % 8u;
    uint block = (row_byte + sb * BLOCK_BYTES) / 4u;
    uint t = LOAD_WORDS[block] ^ LOAD_WORDS[block + QS_OFFSET / 4u + 4u * v];
#if defined(TYPE_Q5_K)
    t ^= LOAD_WORDS[block + QH_OFFSET / 4u + 4u * (v & 1u)];
#endif
    return t;
}
#endif

#elif defined(TYPE_Q6_K)
Unit LOAD_UNIT(uint row_byte, uint u) {
    Unit un;
    uint sb = u / 4u;
    un.n = (u / 2u) % 2u;
    un.half_l = u % 2u;
    uint block16 = (row_byte + sb * Q6_BODY_BYTES) / 16u;
    un.ql[0] = LOAD_WORDS4[block16 + 4u * un.n + un.half_l];
    un.ql[1] = LOAD_WORDS4[block16 + 4u * un.n + 2u + un.half_l];
    un.qh = LOAD_WORDS4[block16 + 8u + 2u * un.n + un.half_l];
    un.scales = LOAD_WORDS4[block16 + 12u];
    un.d = LOAD_F16_AT(row_byte + Q6_BODY_BYTES * blocks_per_row() + 2u * sb);
    return un;
}

#if defined(TOUCH_UNIT)
// One word of each of the unit's 16-byte loads but the row's scales d.
uint TOUCH_UNIT(uint row_byte, uint u) {
    uint sb = u / 4u;
    uint n = (u / 2u) % 2u;
    uint half_l = u % 2u;
    uint block16 = (row_byte + sb * Q6_BODY_BYTES) / 16u;
    return LOAD_WORDS[4u * (block16 + 4u * n + half_l)]
         ^ LOAD_WORDS[4u * (block16 + 4u * n + 2u + half_l)]
         ^ LOAD_WORDS[4u * (block16 + 8u + 2u * n + half_l)]
         ^ LOAD_WORDS[4u * (block16 + 12u)];
}
#endif

#elif defined(TYPE_FQ3)
Unit LOAD_UNIT(uint row_byte, uint u) {
    Unit un;
    uint nb = blocks_per_row();
    uint row16 = row_byte / 16u;
    un.a = LOAD_WORDS4[row16 + u];
    un.b = LOAD_WORDS4[row16 + 2u * nb + u];
    un.c = LOAD_WORDS4[row16 + 4u * nb + u];
    un.head = LOAD_WORDS4[row16 + 6u * nb + u / 2u];
    un.j0 = 4u * (u & 1u);
    return un;
}
#endif

#if defined(TOUCH_UNIT) && !(defined(TYPE_Q4_K) || defined(TYPE_Q5_K) || defined(TYPE_Q6_K))
// Only the K-quant units are touched.
uint TOUCH_UNIT(uint row_byte, uint u) {
    return 0u;
}
#endif

#undef LOAD_F16_AT
