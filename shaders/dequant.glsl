// Weight decoding shared by every matmul kernel.
//
// Weights are bound as a plain uint[] (no 8/16-bit storage feature is needed)
// and unpacked with shifts. Every row starts on a 16-byte boundary (the upload
// pads the row stride). Rows are stored in the device layout that upload()
// writes (docs/GPU.md, "Device weight layout"): F32, F16, Q4_K and Q5_K rows
// keep the GGUF bytes; the other types (and FQ3) are split per row into a
// 16-byte aligned array of quants followed by the small per-block fields, e.g.
// a Q4_0 row of nb blocks is qs[nb][16] then d[nb] (same size as the GGUF row).
//
// The include site defines exactly one TYPE_X and declares
//     layout(std430, binding = 0) readonly buffer Weights { uint w[]; };
// (and common.glsl's push constants: n_in gives the blocks per row) before
// including this file. Each type provides BLOCK_VALUES, BLOCK_BYTES and
//     void dequant8(uint row_byte, uint blk, uint k, out vec4 lo, out vec4 hi)
// which decodes values 8k .. 8k+7 of block blk of the row starting at byte
// row_byte.

// The 32-bit word starting at any even byte address (funnel shift across two words).
uint load_u32(uint byte_addr) {
    uint i = byte_addr >> 2;
    uint s = (byte_addr & 3u) * 8u;
    uint lo = w[i];
    if (s == 0u) {
        return lo;
    }
    return (lo >> s) | (w[i + 1u] << (32u - s));
}

// The 16-bit word at an even byte address.
uint load_u16(uint byte_addr) {
    return (w[byte_addr >> 2] >> ((byte_addr & 2u) * 8u)) & 0xffffu;
}

float load_f16(uint byte_addr) {
    return unpackHalf2x16(load_u16(byte_addr)).x;
}

// The byte at any address.
uint load_u8(uint byte_addr) {
    return (w[byte_addr >> 2] >> ((byte_addr & 3u) * 8u)) & 0xffu;
}

// Quants become floats without int-to-float conversions (an eighth-rate
// instruction on the H200, 16 per clock and multiprocessor against 128
// float additions, and the bottleneck of a naive nibble decode): a field at
// bits [s, s + width) with s + width <= 23, OR-ed under the exponent of
// 2^(23 - s), is the float 2^(23 - s) + field, and one subtraction of that
// constant (plus the type's offset) leaves the exact value, the same float
// a conversion gives.

const uint EXP_S0 = 0x4B000000u;  // 2^23: fields at bit 0
const uint EXP_S8 = 0x47000000u;  // 2^15: fields at bit 8
const float M_S0 = 8388608.0;
const float M_S8 = 32768.0;

// The four bytes of v (byte i is value i) minus off.
vec4 byte_fields(uint v, float off) {
    uint h = v >> 16;
    return vec4(uintBitsToFloat((v & 0xFFu) | EXP_S0) - (M_S0 + off),
                uintBitsToFloat((v & 0xFF00u) | EXP_S8) - (M_S8 + off),
                uintBitsToFloat((h & 0xFFu) | EXP_S0) - (M_S0 + off),
                uintBitsToFloat((h & 0xFF00u) | EXP_S8) - (M_S8 + off));
}

// A small unsigned integer (< 2^23) as a float, without a conversion instruction.
float small_uint_float(uint v) {
    return uintBitsToFloat(v | EXP_S0) - M_S0;
}

// Four unsigned bytes of a word as floats (byte 0 in .x).
vec4 bytes4(uint v) {
    return byte_fields(v, 0.0);
}

// Four signed bytes of a word as floats: biased by 128 to decode them as
// unsigned fields.
vec4 sbytes4(uint v) {
    return byte_fields(v ^ 0x80808080u, 128.0);
}

// A signed byte (bits 0..7 of b, nothing above) as a float.
float sbyte_float(uint b) {
    return small_uint_float(b ^ 0x80u) - 128.0;
}

// Low / high nibbles of the four bytes of a word.
vec4 lo_nibbles(uint v) { return bytes4(v & 0x0f0f0f0fu); }
vec4 hi_nibbles(uint v) { return bytes4((v >> 4) & 0x0f0f0f0fu); }

// Spread four bits (bit 0..3 of b) into the bytes of a word, each as 0 or 1.
uint spread4(uint b) {
    return (b & 1u) | ((b & 2u) << 7) | ((b & 4u) << 14) | ((b & 8u) << 21);
}

// Blocks per row (BLOCK_VALUES is defined below, before any use).
#define blocks_per_row() (p.n_in / BLOCK_VALUES)

// Scale and min of sub-block j from the 12-byte 6-bit packing of Q4_K, Q5_K
// and FQ3 held in three words: sub-block j's bytes are byte j & 3 of each
// word (j < 4: scale = word 0, min = word 1, low 6 bits; j >= 4: the low /
// high nibble of word 2 under the top 2 bits of words 0 / 1), so the two
// cases differ only in the final masks and one select picks between them.
// (Neighbouring lanes decode different sub-blocks: a branch on j < 4
// diverged and every lane paid for both cases.)
vec2 scale_min_k4_words(uvec3 s, uint j) {
    uint sh = 8u * (j & 3u);
    uint b0 = (s.x >> sh) & 0xffu;
    uint b1 = (s.y >> sh) & 0xffu;
    uint e = (s.z >> sh) & 0xffu;
    uint sc = j < 4u ? b0 & 63u : (e & 15u) | ((b0 >> 2) & 48u);
    uint m = j < 4u ? b1 & 63u : (e >> 4) | ((b1 >> 2) & 48u);
    return vec2(small_uint_float(sc), small_uint_float(m));
}

// The same from the packing at byte scales_byte (a word boundary: the
// packings sit 4 bytes into 16-byte aligned blocks or heads).
vec2 scale_min_k4(uint scales_byte, uint j) {
    uint i = scales_byte >> 2;
    return scale_min_k4_words(uvec3(w[i], w[i + 1u], w[i + 2u]), j);
}

#if defined(TYPE_F32)
#define BLOCK_VALUES 8u
#define BLOCK_BYTES 32u
void dequant8(uint row_byte, uint blk, uint k, out vec4 lo, out vec4 hi) {
    uint i = (row_byte + blk * BLOCK_BYTES) >> 2;
    lo = uintBitsToFloat(uvec4(w[i], w[i + 1u], w[i + 2u], w[i + 3u]));
    hi = uintBitsToFloat(uvec4(w[i + 4u], w[i + 5u], w[i + 6u], w[i + 7u]));
}

#elif defined(TYPE_F16)
#define BLOCK_VALUES 8u
#define BLOCK_BYTES 16u
void dequant8(uint row_byte, uint blk, uint k, out vec4 lo, out vec4 hi) {
    uint i = (row_byte + blk * BLOCK_BYTES) >> 2;
    lo = vec4(unpackHalf2x16(w[i]), unpackHalf2x16(w[i + 1u]));
    hi = vec4(unpackHalf2x16(w[i + 2u]), unpackHalf2x16(w[i + 3u]));
}

#elif defined(TYPE_Q4_0)
// Device row: qs[nb][16], d[nb] (f16). qs[j] & 15 is value j, qs[j] >> 4
// value j + 16; value = d * (q - 8).
#define BLOCK_VALUES 32u
#define BLOCK_BYTES 18u
void dequant8(uint row_byte, uint blk, uint k, out vec4 lo, out vec4 hi) {
    float d = load_f16(row_byte + 16u * blocks_per_row() + 2u * blk);
    uint q = (row_byte + 16u * blk) / 4u + (k & 1u) * 2u;
    uint a = w[q];
    uint b = w[q + 1u];
    if (k >= 2u) {
        a >>= 4;
        b >>= 4;
    }
    lo = d * (bytes4(a & 0x0f0f0f0fu) - 8.0);
    hi = d * (bytes4(b & 0x0f0f0f0fu) - 8.0);
}

#elif defined(TYPE_Q4_1)
// Device row: qs[nb][16], (d, m)[nb] (f16 pairs); value = d * q + m.
#define BLOCK_VALUES 32u
#define BLOCK_BYTES 20u
void dequant8(uint row_byte, uint blk, uint k, out vec4 lo, out vec4 hi) {
    vec2 dm = unpackHalf2x16(w[(row_byte + 16u * blocks_per_row()) / 4u + blk]);
    uint q = (row_byte + 16u * blk) / 4u + (k & 1u) * 2u;
    uint a = w[q];
    uint b = w[q + 1u];
    if (k >= 2u) {
        a >>= 4;
        b >>= 4;
    }
    lo = dm.x * bytes4(a & 0x0f0f0f0fu) + dm.y;
    hi = dm.x * bytes4(b & 0x0f0f0f0fu) + dm.y;
}

#elif defined(TYPE_Q5_0) || defined(TYPE_Q5_1)
// Device row: qs[nb][16], qh'[nb] (u32), then d[nb] (Q5_0, f16) or
// (d, m)[nb] (Q5_1, f16 pairs). qh' holds the fifth bit of value 4c + i
// (c, i < 4) at bit 8i + c and of value 16 + 4c + i at bit 8i + 4 + c, so
// that one shift lines up the fifth bits of qs word c with its nibbles
// (see qh5_lo / qh5_hi). Q5_0: value = d * (q - 16); Q5_1: d * q + m.
#define BLOCK_VALUES 32u
#if defined(TYPE_Q5_0)
#define BLOCK_BYTES 22u
#else
#define BLOCK_BYTES 24u
#endif

// Fifth bits of the low / high nibbles of qs word c, at bit 4 of each byte.
uint qh5_lo(uint qh, uint c) {
    return (qh << (4u - c)) & 0x10101010u;
}
uint qh5_hi(uint qh, uint c) {
    return (qh >> c) & 0x10101010u;
}

void dequant8(uint row_byte, uint blk, uint k, out vec4 lo, out vec4 hi) {
    uint nb = blocks_per_row();
    uint qh = w[(row_byte + 16u * nb) / 4u + blk];
    uint c = (k & 1u) * 2u;
    uint q = (row_byte + 16u * blk) / 4u + c;
    uint a = w[q];
    uint b = w[q + 1u];
    if (k >= 2u) {
        a = ((a >> 4) & 0x0f0f0f0fu) | qh5_hi(qh, c);
        b = ((b >> 4) & 0x0f0f0f0fu) | qh5_hi(qh, c + 1u);
    } else {
        a = (a & 0x0f0f0f0fu) | qh5_lo(qh, c);
        b = (b & 0x0f0f0f0fu) | qh5_lo(qh, c + 1u);
    }
#if defined(TYPE_Q5_0)
    float d = load_f16(row_byte + 20u * nb + 2u * blk);
    lo = d * (bytes4(a) - 16.0);
    hi = d * (bytes4(b) - 16.0);
#else
    vec2 dm = unpackHalf2x16(w[(row_byte + 20u * nb) / 4u + blk]);
    lo = dm.x * bytes4(a) + dm.y;
    hi = dm.x * bytes4(b) + dm.y;
#endif
}

#elif defined(TYPE_Q8_0)
// Device row: int8 qs[nb][32], d[nb] (f16); value = d * q.
#define BLOCK_VALUES 32u
#define BLOCK_BYTES 34u
void dequant8(uint row_byte, uint blk, uint k, out vec4 lo, out vec4 hi) {
    float d = load_f16(row_byte + 32u * blocks_per_row() + 2u * blk);
    uint q = (row_byte + 32u * blk) / 4u + 2u * k;
    lo = d * sbytes4(w[q]);
    hi = d * sbytes4(w[q + 1u]);
}

#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
// GGUF layout. Q4_K: f16 d, f16 dmin, scales[12] (eight 6-bit scale/min
// pairs), qs[128]. Q5_K: the same, then qh[32] before qs[128].
// Chunk c (64 values) uses qs[32c..32c+31]: low nibbles with sub-block 2c,
// high nibbles with sub-block 2c+1; value = d * sc * q - dmin * m.
#define BLOCK_VALUES 256u

#if defined(TYPE_Q4_K)
#define BLOCK_BYTES 144u
#define QS_OFFSET 16u
#else
#define BLOCK_BYTES 176u
#define QH_OFFSET 16u
#define QS_OFFSET 48u
#endif

void dequant8(uint row_byte, uint blk, uint k, out vec4 lo, out vec4 hi) {
    uint block_byte = row_byte + blk * BLOCK_BYTES;
    vec2 dd = unpackHalf2x16(w[block_byte >> 2]);
    uint c = k >> 3;
    uint h = (k >> 2) & 1u;
    uint l0 = (k & 3u) * 8u;
    uint j = 2u * c + h;
    vec2 sm = scale_min_k4(block_byte + 4u, j);
    float scale = dd.x * sm.x;
    float minv = dd.y * sm.y;
    uint q = (block_byte + QS_OFFSET + 32u * c + l0) >> 2;
    uint a = (w[q] >> (4u * h)) & 0x0f0f0f0fu;
    uint b = (w[q + 1u] >> (4u * h)) & 0x0f0f0f0fu;
#if defined(TYPE_Q5_K)
    uint qhw = (block_byte + QH_OFFSET + l0) >> 2;
    a |= ((w[qhw] >> j) & 0x01010101u) << 4;
    b |= ((w[qhw + 1u] >> j) & 0x01010101u) << 4;
#endif
    lo = scale * bytes4(a) - minv;
    hi = scale * bytes4(b) - minv;
}

#elif defined(TYPE_Q6_K)
// Device row: the first 208 bytes of each GGUF block (ql[128], qh[64],
// int8 scales[16]) as blocks of 208 bytes, then d[nb] (f16).
// Half n (128 values): quarter qq uses ql[64n + 32(qq&1) + l] (low nibble for
// qq < 2, high otherwise), 2 bits (qh[32n + l] >> 2qq), scale 8n + l/16 + 2qq;
// value = d * scale * (q - 32).
#define BLOCK_VALUES 256u
#define BLOCK_BYTES 210u
#define Q6_BODY_BYTES 208u
void dequant8(uint row_byte, uint blk, uint k, out vec4 lo, out vec4 hi) {
    uint block_byte = row_byte + blk * Q6_BODY_BYTES;
    float d = load_f16(row_byte + Q6_BODY_BYTES * blocks_per_row() + 2u * blk);
    uint n = k >> 4;
    uint qq = (k >> 2) & 3u;
    uint l0 = (k & 3u) * 8u;
    uint ql = (block_byte + 64u * n + 32u * (qq & 1u) + l0) >> 2;
    uint shift = (qq >> 1) * 4u;
    uint a = (w[ql] >> shift) & 0x0f0f0f0fu;
    uint b = (w[ql + 1u] >> shift) & 0x0f0f0f0fu;
    uint qh = (block_byte + 128u + 32u * n + l0) >> 2;
    a |= ((w[qh] >> (2u * qq)) & 0x03030303u) << 4;
    b |= ((w[qh + 1u] >> (2u * qq)) & 0x03030303u) << 4;
    uint sc_byte = load_u8(block_byte + 192u + 8u * n + (l0 >> 4) + 2u * qq);
    float scale = d * sbyte_float(sc_byte);
    lo = scale * (bytes4(a) - 32.0);
    hi = scale * (bytes4(b) - 32.0);
}

#elif defined(TYPE_FQ3)
// Device row (upload.rs): one u32 word per group of 32 values in three
// planes, A[8nb], B[8nb], C[8nb] (group G = 8 blk + g), then the 16-byte
// block heads[nb]: f16 d, f16 dmin, the 12-byte scale/min packing of Q4_K.
// Values 4s .. 4s+3 of a group are the bytes of fq3_codes(s < 4 ? A : B, C, s);
// value = d * sc * q - dmin * m, q in 0..7.
#define BLOCK_VALUES 256u
#define BLOCK_BYTES 112u

// The 3-bit codes of values 4s .. 4s+3 of a group, one per byte: two bits
// from the low word (A for s < 4, B otherwise), the third from C.
uint fq3_codes(uint low, uint c, uint s) {
    return ((low >> (2u * (s & 3u))) & 0x03030303u) | (((c >> s) & 0x01010101u) << 2);
}

void dequant8(uint row_byte, uint blk, uint k, out vec4 lo, out vec4 hi) {
    uint nb = blocks_per_row();
    uint g = k >> 2;
    uint s = 2u * (k & 3u);
    uint a_word = row_byte / 4u + 8u * blk + g;
    uint low = w[a_word + (s < 4u ? 0u : 8u * nb)];
    uint c = w[a_word + 16u * nb];
    uint head = row_byte + 96u * nb + 16u * blk;
    vec2 dd = unpackHalf2x16(w[head >> 2]);
    vec2 sm = scale_min_k4(head + 4u, g);
    float scale = dd.x * sm.x;
    float minv = dd.y * sm.y;
    lo = scale * bytes4(fq3_codes(low, c, s)) - minv;
    hi = scale * bytes4(fq3_codes(low, c, s + 1u)) - minv;
}

#else
#error "define one TYPE_X"
#endif

#define GROUPS_PER_BLOCK (BLOCK_VALUES / 8u)

// Values 8g .. 8g+7 of the row starting at byte row_byte.
void dequant_group(uint row_byte, uint g, out vec4 lo, out vec4 hi) {
    uint blk = g / GROUPS_PER_BLOCK;
    dequant8(row_byte, blk, g - blk * GROUPS_PER_BLOCK, lo, hi);
}
