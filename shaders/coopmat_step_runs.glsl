// Step runs of matmul_coopmat.comp for Q4_K, Q5_K and Q6_K: RUN_VALUES (8,
// 16 or 32) consecutive values of one weight row inside one 32-value sub-block,
// fetched and decoded as one unit of the A staging:
//     StepRun step_run_fetch(uint row_byte, uint g0, StepRun prev, bool follows)
//                                                        the run whose first group is g0
//     void step_run_put(StepRun r, uint g0, uint a_base, uint row, uint kg0)
//                                                        its values into row `row`, groups kg0.., of the A tile at a_base
// The includer defines RUN_VALUES (a constant or specialisation-constant
// expression) and has included coopmat_raw.glsl (fetch16 / fetch8) and
// coopmat_frag.glsl (put_a).
//
// A step of 32 values is one sub-block of a row (a Q6_K quarter), so its
// runs share the block head (Q6_K: d and the scale word) and the
// sub-block's scale and min. Through raw_fetch every
// 8-value group loads the head and 8 quant bytes and decodes the scale and
// min again: on the H200 the wide tile spent more on that staging than on
// its products (an ablation that stored the raw words undecoded ran Q4_K
// at 234 TFLOPS against 131). A run loads the head once and its quant
// bytes in 16-byte words (Q4_K, 32 values: 3 loads instead of 8; Q6_K 6
// instead of 16) and decodes the scale and min once. Each value is computed
// by raw_decode's expression (in f32, then f16), so the staged tile holds
// the same bits as with 8-value groups.
//
// With `follows`, `prev` is the run of the same row and place fetched for
// the step before (32 values earlier), and the words the two share are
// taken from it instead of loaded again: the block head within a block,
// and Q4_K's quant bytes, whose high nibbles are the sub-block after the
// low nibbles' (Q6_K: d within a block, the qh bytes within a half, the
// scale word within two quarters). Steps of 32 values with one register
// set (PIPELINE = 1) fetch in order, so there every step but a
// workgroup's first follows the one before.

const uint RUN_WORDS = RUN_VALUES / 4u;

// The quant words are sized for the longest run (arrays sized by a
// specialisation constant cannot be copied); a shorter run leaves the
// words past RUN_WORDS unwritten and unread, so they take no registers.
#define MAX_RUN_WORDS 8u
// RUN_WORDS words from byte_addr (16-byte aligned for 4 or 8 words,
// 8-byte aligned for 2) into dst.
#define FETCH_RUN_WORDS(dst, byte_addr) { \
        if (RUN_WORDS == 2u) { \
            uvec2 v_ = fetch8(byte_addr); \
            dst[0] = v_.x; dst[1] = v_.y; \
        } else { \
            [[unroll]] for (uint i_ = 0u; i_ < RUN_WORDS / 4u; i_++) { \
                uvec4 v_ = fetch16((byte_addr) + 16u * i_); \
                dst[4u * i_] = v_.x; dst[4u * i_ + 1u] = v_.y; \
                dst[4u * i_ + 2u] = v_.z; dst[4u * i_ + 3u] = v_.w; \
            } \
        } \
    }

#if defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
// The block head (d, dmin, the scale words) and the run's quant bytes
// (Q5_K: and its qh bytes).
struct StepRun {
    uvec4 head;
    uint q[MAX_RUN_WORDS];
#if defined(TYPE_Q5_K)
    uint qh[MAX_RUN_WORDS];
#endif
};

StepRun step_run_fetch(uint row_byte, uint g0, StepRun prev, bool follows) {
    StepRun r = prev;
    uint blk = g0 / GROUPS_PER_BLOCK;
    uint k = g0 - blk * GROUPS_PER_BLOCK;
    uint block_byte = row_byte + blk * BLOCK_BYTES;
    uint l0 = (k & 3u) * 8u;
    uint sub = k >> 2;
    if (!follows || sub == 0u) {
        r.head = fetch16(block_byte);
    }
#if defined(TYPE_Q5_K)
    // Q5_K's qh bytes serve the whole block (bit j for sub-block j).
    if (!follows || sub == 0u) {
        FETCH_RUN_WORDS(r.qh, block_byte + QH_OFFSET + l0);
    }
#endif
    if (!follows || (sub & 1u) == 0u) {
        FETCH_RUN_WORDS(r.q, block_byte + QS_OFFSET + 32u * (k >> 3) + l0);
    }
    return r;
}

void step_run_put(StepRun r, uint g0, uint a_base, uint row, uint kg0) {
    uint k = g0 % GROUPS_PER_BLOCK;
    vec2 dd = unpackHalf2x16(r.head.x);
    uint h = (k >> 2) & 1u;
    uint j = 2u * (k >> 3) + h;
    vec2 sm = scale_min_k4_words(r.head.yzw, j);
    float scale = dd.x * sm.x;
    float minv = dd.y * sm.y;
    [[unroll]] for (uint i = 0u; i < RUN_WORDS / 2u; i++) {
        uint a = (r.q[2u * i] >> (4u * h)) & 0x0f0f0f0fu;
        uint b = (r.q[2u * i + 1u] >> (4u * h)) & 0x0f0f0f0fu;
#if defined(TYPE_Q5_K)
        a |= ((r.qh[2u * i] >> j) & 0x01010101u) << 4;
        b |= ((r.qh[2u * i + 1u] >> j) & 0x01010101u) << 4;
#endif
        vec4 lo = scale * bytes4(a) - minv;
        vec4 hi = scale * bytes4(b) - minv;
        put_a(a_base, row, kg0 + i, lo, hi);
    }
}

#elif defined(TYPE_Q6_K)
// The word holding d, the word holding the quarter's two scale bytes, and
// the run's ql and qh bytes (the layout q6_group of coopmat_raw.glsl reads).
struct StepRun {
    uint d_word;
    uint sc_word;
    uint ql[MAX_RUN_WORDS];
    uint qh[MAX_RUN_WORDS];
};

StepRun step_run_fetch(uint row_byte, uint g0, StepRun prev, bool follows) {
    StepRun r = prev;
    uint blk = g0 / GROUPS_PER_BLOCK;
    uint k = g0 - blk * GROUPS_PER_BLOCK;
    uint block_byte = row_byte + blk * Q6_BODY_BYTES;
    uint n = k >> 4;
    uint qq = (k >> 2) & 3u;
    uint l0 = (k & 3u) * 8u;
    if (!follows || k < 4u) {
        r.d_word = w[(row_byte + Q6_BODY_BYTES * blocks_per_row() + 2u * blk) >> 2];
    }
    if (!follows || (qq & 1u) == 0u) {
        r.sc_word = w[(block_byte + 192u + 8u * n + 2u * qq) >> 2];
    }
    FETCH_RUN_WORDS(r.ql, block_byte + 64u * n + 32u * (qq & 1u) + l0);
    if (!follows || qq == 0u) {
        FETCH_RUN_WORDS(r.qh, block_byte + 128u + 32u * n + l0);
    }
    return r;
}

void step_run_put(StepRun r, uint g0, uint a_base, uint row, uint kg0) {
    uint blk = g0 / GROUPS_PER_BLOCK;
    uint k = g0 - blk * GROUPS_PER_BLOCK;
    float d = f16_in(r.d_word, 2u * blk);
    uint qq = (k >> 2) & 3u;
    uint l0 = (k & 3u) * 8u;
    uint shift = (qq >> 1) * 4u;
    [[unroll]] for (uint i = 0u; i < RUN_WORDS / 2u; i++) {
        uint a = (r.ql[2u * i] >> shift) & 0x0f0f0f0fu;
        uint b = (r.ql[2u * i + 1u] >> shift) & 0x0f0f0f0fu;
        a |= ((r.qh[2u * i] >> (2u * qq)) & 0x03030303u) << 4;
        b |= ((r.qh[2u * i + 1u] >> (2u * qq)) & 0x03030303u) << 4;
        // Scales are per 16 values: the byte of group i's half.
        uint sc_byte = byte_in(r.sc_word, ((l0 + 8u * i) >> 4) + 2u * qq);
        float scale = d * sbyte_float(sc_byte);
        vec4 lo = scale * (bytes4(a) - 32.0);
        vec4 hi = scale * (bytes4(b) - 32.0);
        put_a(a_base, row, kg0 + i, lo, hi);
    }
}
#endif
