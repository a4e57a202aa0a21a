// Weight decoding shared by every matmul kernel.
//
// Weights are bound as a plain uint[] (no 8/16-bit storage feature is needed):
// bytes are extracted with shifts, and blocks whose size is not a multiple of
// four (18, 22, 34, 210 bytes) are read with funnel-shifted 32-bit loads.
// Every row starts on a 16-byte boundary (the upload pads the row stride), so
// the byte address of a block is row_base + block * BLOCK_BYTES.
//
// The include site defines exactly one TYPE_X and declares
//     layout(std430, binding = 0) readonly buffer Weights { uint w[]; };
// before including this file. Each type provides
//     BLOCK_VALUES, BLOCK_BYTES and
//     void dequant8(uint block_byte, uint k, out vec4 lo, out vec4 hi)
// which decodes values 8k .. 8k+7 of the block starting at byte block_byte.

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

// Four unsigned bytes of a word as floats (byte 0 in .x).
vec4 bytes4(uint v) {
    return vec4(float(v & 0xffu), float((v >> 8) & 0xffu), float((v >> 16) & 0xffu), float(v >> 24));
}

// Four signed bytes of a word as floats.
vec4 sbytes4(uint v) {
    ivec4 b = ivec4(int(v << 24), int(v << 16), int(v << 8), int(v)) >> 24;
    return vec4(b);
}

// Low / high nibbles of the four bytes of a word.
vec4 lo_nibbles(uint v) { return bytes4(v & 0x0f0f0f0fu); }
vec4 hi_nibbles(uint v) { return bytes4((v >> 4) & 0x0f0f0f0fu); }

// Spread four bits (bit 0..3 of b) into the bytes of a word, each as 0 or 1.
uint spread4(uint b) {
    return (b & 1u) | ((b & 2u) << 7) | ((b & 4u) << 14) | ((b & 8u) << 21);
}

#if defined(TYPE_F32)
#define BLOCK_VALUES 8u
#define BLOCK_BYTES 32u
void dequant8(uint block_byte, uint k, out vec4 lo, out vec4 hi) {
    uint i = block_byte >> 2;
    lo = uintBitsToFloat(uvec4(w[i], w[i + 1u], w[i + 2u], w[i + 3u]));
    hi = uintBitsToFloat(uvec4(w[i + 4u], w[i + 5u], w[i + 6u], w[i + 7u]));
}

#elif defined(TYPE_F16)
#define BLOCK_VALUES 8u
#define BLOCK_BYTES 16u
void dequant8(uint block_byte, uint k, out vec4 lo, out vec4 hi) {
    uint i = block_byte >> 2;
    lo = vec4(unpackHalf2x16(w[i]), unpackHalf2x16(w[i + 1u]));
    hi = vec4(unpackHalf2x16(w[i + 2u]), unpackHalf2x16(w[i + 3u]));
}

#elif defined(TYPE_Q4_0)
// f16 d; qs[16]: value j = d * ((qs[j] & 15) - 8), value j + 16 = d * ((qs[j] >> 4) - 8).
#define BLOCK_VALUES 32u
#define BLOCK_BYTES 18u
void dequant8(uint block_byte, uint k, out vec4 lo, out vec4 hi) {
    float d = load_f16(block_byte);
    uint q = block_byte + 2u + (k & 1u) * 8u;
    uint a = load_u32(q);
    uint b = load_u32(q + 4u);
    if (k >= 2u) {
        a >>= 4;
        b >>= 4;
    }
    lo = d * (bytes4(a & 0x0f0f0f0fu) - 8.0);
    hi = d * (bytes4(b & 0x0f0f0f0fu) - 8.0);
}

#elif defined(TYPE_Q4_1)
// f16 d, f16 m; qs[16]: value = d * q + m.
#define BLOCK_VALUES 32u
#define BLOCK_BYTES 20u
void dequant8(uint block_byte, uint k, out vec4 lo, out vec4 hi) {
    vec2 dm = unpackHalf2x16(w[block_byte >> 2]);
    uint q = (block_byte >> 2) + 1u + (k & 1u) * 2u;
    uint a = w[q];
    uint b = w[q + 1u];
    if (k >= 2u) {
        a >>= 4;
        b >>= 4;
    }
    lo = dm.x * bytes4(a & 0x0f0f0f0fu) + dm.y;
    hi = dm.x * bytes4(b & 0x0f0f0f0fu) + dm.y;
}

#elif defined(TYPE_Q5_0)
// f16 d; qh (32 high bits); qs[16]: value = d * ((nibble | high bit << 4) - 16).
#define BLOCK_VALUES 32u
#define BLOCK_BYTES 22u
void dequant8(uint block_byte, uint k, out vec4 lo, out vec4 hi) {
    float d = load_f16(block_byte);
    uint qh = load_u32(block_byte + 2u) >> (k * 8u);
    uint q = block_byte + 6u + (k & 1u) * 8u;
    uint a = load_u32(q);
    uint b = load_u32(q + 4u);
    if (k >= 2u) {
        a >>= 4;
        b >>= 4;
    }
    a = (a & 0x0f0f0f0fu) | (spread4(qh) << 4);
    b = (b & 0x0f0f0f0fu) | (spread4(qh >> 4) << 4);
    lo = d * (bytes4(a) - 16.0);
    hi = d * (bytes4(b) - 16.0);
}

#elif defined(TYPE_Q5_1)
// f16 d, f16 m; qh; qs[16]: value = d * (nibble | high bit << 4) + m.
#define BLOCK_VALUES 32u
#define BLOCK_BYTES 24u
void dequant8(uint block_byte, uint k, out vec4 lo, out vec4 hi) {
    uint i = block_byte >> 2;
    vec2 dm = unpackHalf2x16(w[i]);
    uint qh = w[i + 1u] >> (k * 8u);
    uint q = i + 2u + (k & 1u) * 2u;
    uint a = w[q];
    uint b = w[q + 1u];
    if (k >= 2u) {
        a >>= 4;
        b >>= 4;
    }
    a = (a & 0x0f0f0f0fu) | (spread4(qh) << 4);
    b = (b & 0x0f0f0f0fu) | (spread4(qh >> 4) << 4);
    lo = dm.x * bytes4(a) + dm.y;
    hi = dm.x * bytes4(b) + dm.y;
}

#elif defined(TYPE_Q8_0)
// f16 d; int8 qs[32]: value = d * q.
#define BLOCK_VALUES 32u
#define BLOCK_BYTES 34u
void dequant8(uint block_byte, uint k, out vec4 lo, out vec4 hi) {
    float d = load_f16(block_byte);
    uint q = block_byte + 2u + k * 8u;
    lo = d * sbytes4(load_u32(q));
    hi = d * sbytes4(load_u32(q + 4u));
}

#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
// Q4_K: f16 d, f16 dmin, scales[12] (eight 6-bit scale/min pairs), qs[128].
// Q5_K: the same, then qh[32] before qs[128].
// Chunk c (64 values) uses qs[32c..32c+31]: low nibbles with sub-block 2c,
// high nibbles with sub-block 2c+1; value = d * sc * q - dmin * m.
#define BLOCK_VALUES 256u

// Scale and min of sub-block j from the 12-byte packing.
vec2 scale_min_k4(uint scales_byte, uint j) {
    if (j < 4u) {
        return vec2(float(load_u8(scales_byte + j) & 63u), float(load_u8(scales_byte + j + 4u) & 63u));
    }
    uint e = load_u8(scales_byte + j + 4u);
    uint sc = (e & 15u) | ((load_u8(scales_byte + j - 4u) >> 6) << 4);
    uint m = (e >> 4) | ((load_u8(scales_byte + j) >> 6) << 4);
    return vec2(float(sc), float(m));
}

#if defined(TYPE_Q4_K)
#define BLOCK_BYTES 144u
#define QS_OFFSET 16u
#else
#define BLOCK_BYTES 176u
#define QH_OFFSET 16u
#define QS_OFFSET 48u
#endif

void dequant8(uint block_byte, uint k, out vec4 lo, out vec4 hi) {
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
// ql[128], qh[64], int8 scales[16], f16 d (210 bytes).
// Half n (128 values): quarter qq uses ql[64n + 32(qq&1) + l] (low nibble for
// qq < 2, high otherwise), 2 bits (qh[32n + l] >> 2qq), scale 8n + l/16 + 2qq;
// value = d * scale * (q - 32).
#define BLOCK_VALUES 256u
#define BLOCK_BYTES 210u
void dequant8(uint block_byte, uint k, out vec4 lo, out vec4 hi) {
    float d = load_f16(block_byte + 208u);
    uint n = k >> 4;
    uint qq = (k >> 2) & 3u;
    uint l0 = (k & 3u) * 8u;
    uint ql = block_byte + 64u * n + 32u * (qq & 1u) + l0;
    uint shift = (qq >> 1) * 4u;
    uint a = (load_u32(ql) >> shift) & 0x0f0f0f0fu;
    uint b = (load_u32(ql + 4u) >> shift) & 0x0f0f0f0fu;
    uint qh = block_byte + 128u + 32u * n + l0;
    a |= ((load_u32(qh) >> (2u * qq)) & 0x03030303u) << 4;
    b |= ((load_u32(qh + 4u) >> (2u * qq)) & 0x03030303u) << 4;
    uint sc_byte = load_u8(block_byte + 192u + 8u * n + (l0 >> 4) + 2u * qq);
    float scale = d * float(int(sc_byte << 24) >> 24);
    lo = scale * (bytes4(a) - 32.0);
    hi = scale * (bytes4(b) - 32.0);
}

#else
#error "define one TYPE_X"
#endif

#define GROUPS_PER_BLOCK (BLOCK_VALUES / 8u)

// Values 8g .. 8g+7 of the row starting at byte row_byte.
void dequant_group(uint row_byte, uint g, out vec4 lo, out vec4 hi) {
    uint blk = g / GROUPS_PER_BLOCK;
    dequant8(row_byte + blk * BLOCK_BYTES, g - blk * GROUPS_PER_BLOCK, lo, hi);
}
