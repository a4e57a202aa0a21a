#version 450
// Causal grouped-query attention for the multi-token chunks of a plain
// forward (consecutive positions of one sequence slot): one workgroup per
// (query head, block of QB consecutive tokens), every accumulation f32.
//
// span_attention.comp runs one workgroup per (head, token), so each of a
// chunk's tokens reads every earlier key and value row of its KV head on its
// own. Here the block's QB queries share those reads: the keys and values
// are staged in shared memory a tile at a time (KT keys, one 16-byte load
// per 8 f16 values, coalesced), and every query of the block scores the
// staged keys and sums the staged values. A tile's global reads are thus
// spread over QB queries instead of one.
//
// Thread layout (128 threads): LANES = 8 threads per query, QB = 16 queries.
// Scoring: lane l of query i takes keys l, l + 8, ... of the tile (four of a
// 32-key tile), the query read from shared memory as f32. Each query's tile
// maximum goes through shared memory to its eight lanes; each lane keeps a
// partial softmax sum of its own keys (every lane of a query rescales by the
// same factor, so the partial sums add up at the end). Values: lane l of
// query i owns the 8-value groups l, l + 8, ... of the output row and adds
// each staged key's weighted value row into them.
//
// Shared memory (32 KiB, the most lavapipe allows; NVIDIA allows 48): one
// pool holds the block's queries as f32 (QB x head_dim: 8 KiB at 128, 16 at
// 256), then a key tile and a value tile of as many keys as fit, a multiple
// of LANES up to 32 (32 keys at head_dim 128, 8 at 256); key rows are padded
// by 16 bytes so that the eight lanes' rows fall into different banks. Then
// the tile's weights (2 KiB) and a word per thread.
//
// The host uses this kernel only where head_dim, head_dim_v, k_dim and v_dim
// are multiples of 8 and head_dim, head_dim_v <= MAX_HEAD_DIM, and only for
// plain forwards, whose tokens all sit in slot 0 (the block's key rows are
// staged from the first token's slot).
#extension GL_GOOGLE_include_directive : require

#define WG 128u
#define MAX_HEAD_DIM 256u
// Queries per workgroup and threads per query.
#define QB 16u
#define LANES 8u
// The most keys per tile.
#define KT_MAX 32u
// Keys a lane scores per tile.
#define KEYS_PER_LANE (KT_MAX / LANES)
// Output 8-value groups a lane owns.
#define GROUPS_PER_LANE (MAX_HEAD_DIM / 8u / LANES)
layout(local_size_x = 128) in;

#include "span_common.glsl"

layout(std430, binding = 0) readonly buffer Qkv { float qkv[]; };
// Keys and values as 16-byte words (8 f16 values each).
layout(std430, binding = 1) readonly buffer KCache4 { uvec4 kc4[]; };
layout(std430, binding = 2) readonly buffer VCache4 { uvec4 vc4[]; };
layout(std430, binding = 3) writeonly buffer Out { float attn[]; };
// The same as f16 (8 values per word) with `f16_out`, for a wo projection
// on the cooperative prefill kernel (`MatmulInput::F16`).
layout(std430, binding = 3) writeonly buffer OutH { uvec4 attn_h[]; };

layout(push_constant) uniform Push {
    // As span_attention.comp.
    uint tok_base;
    uint n_head;
    uint n_head_kv;
    uint head_dim;
    uint head_dim_v;
    uint k_dim;
    uint v_dim;
    uint window;
    float scale;
    // Tokens of the chunk (the last block may be partial).
    uint n_tok;
    // 1: write the output in f16 (attn_h; head_dim_v a multiple of 8).
    uint f16_out;
} p;

// 16-byte words of the pool: 32 KiB less the weights and lane_buf.
#define POOL_WORDS 1884u
// From word 0 the block's queries (f32 bits), row i at i * head_dim / 4;
// from q_words the key rows of the tile, (head_dim / 8 + 1) words apart;
// from q_words + kt * (head_dim / 8 + 1) the value rows, head_dim_v / 8
// words apart.
shared uvec4 pool[POOL_WORDS];
// The tile's softmax weights, row i (query) at i * (KT_MAX + 1).
shared float weight[QB * (KT_MAX + 1u)];
// Per-thread values that the lanes of a query combine.
shared float lane_buf[WG];

// The first position a query at `pos` sees.
uint first_visible(uint pos) {
    return (p.window > 0u && pos + 1u > p.window) ? pos + 1u - p.window : 0u;
}

// Max (is_max) or sum of the LANES values in lane_buf of query qi.
float query_reduce(uint qi, bool is_max) {
    float r = lane_buf[qi * LANES];
    for (uint i = 1u; i < LANES; i++) {
        float o = lane_buf[qi * LANES + i];
        r = is_max ? max(r, o) : r + o;
    }
    return r;
}

void main() {
    uint h = gl_WorkGroupID.x;
    // The last blocks of a chunk see the most keys: they get the lowest
    // workgroup ids, which the GPU starts first, so that the short blocks
    // fill in behind them instead of the long ones trailing at the end.
    uint t0 = (gl_NumWorkGroups.y - 1u - gl_WorkGroupID.y) * QB;
    uint tid = gl_LocalInvocationID.x;
    uint qi = tid / LANES;
    uint lane = tid % LANES;
    uint nq = min(QB, p.n_tok - t0);
    bool q_live = qi < nq;
    uint kv_head = h / (p.n_head / p.n_head_kv);

    // Positions of this thread's query (the last live one for the lanes of
    // a partial block's missing queries) and the block's key range.
    uint pos = token_place(p.tok_base + t0 + min(qi, nq - 1u)).x;
    uint first = first_visible(pos);
    uvec2 block_place = token_place(p.tok_base + t0);
    uint row0 = block_place.y;
    uint block_first = first_visible(block_place.x);
    uint block_end = token_place(p.tok_base + t0 + nq - 1u).x + 1u;

    uint d4 = p.head_dim / 4u;
    uint d8 = p.head_dim / 8u;
    uint dv8 = p.head_dim_v / 8u;
    uint k_stride = d8 + 1u;
    uint q_words = QB * d4;
    uint kt = min(KT_MAX, (POOL_WORDS - q_words) / (k_stride + dv8)) & ~(LANES - 1u);
    uint k_base = q_words;
    uint v_base = q_words + kt * k_stride;
    uint k_row_words = p.k_dim / 8u;
    uint v_row_words = p.v_dim / 8u;
    uint k_head = kv_head * d8;
    uint v_head = kv_head * dv8;

    // The block's queries; the missing rows of a partial block are zeros.
    for (uint i = tid; i < QB * d4; i += WG) {
        uint r = i / d4;
        uint c = i % d4;
        vec4 v = vec4(0.0);
        if (r < nq) {
            uint q0 = ((t0 + r) * p.n_head + h) * p.head_dim + 4u * c;
            v = vec4(qkv[q0], qkv[q0 + 1u], qkv[q0 + 2u], qkv[q0 + 3u]);
        }
        pool[i] = floatBitsToUint(v);
    }

    vec4 acc[2u * GROUPS_PER_LANE];
    for (uint i = 0u; i < 2u * GROUPS_PER_LANE; i++) {
        acc[i] = vec4(0.0);
    }
    float m = -1.0 / 0.0;
    // This lane's share of the softmax denominator.
    float l = 0.0;

    for (uint key0 = block_first; key0 < block_end; key0 += kt) {
        uint nk = min(kt, block_end - key0);
        // Stage the tile (this barrier also orders the previous tile's
        // reads, and at the start the query writes, before these).
        barrier();
        for (uint i = tid; i < nk * d8; i += WG) {
            uint key = i / d8;
            uint c = i % d8;
            pool[k_base + key * k_stride + c] = kc4[(row0 + key0 + key) * k_row_words + k_head + c];
        }
        for (uint i = tid; i < nk * dv8; i += WG) {
            uint key = i / dv8;
            uint c = i % dv8;
            pool[v_base + key * dv8 + c] = vc4[(row0 + key0 + key) * v_row_words + v_head + c];
        }
        barrier();

        // Scores of this lane's keys: lane + LANES * j.
        float s[KEYS_PER_LANE];
        for (uint j = 0u; j < KEYS_PER_LANE; j++) {
            s[j] = 0.0;
        }
        for (uint c = 0u; c < d8; c++) {
            vec4 qa = uintBitsToFloat(pool[qi * d4 + 2u * c]);
            vec4 qb = uintBitsToFloat(pool[qi * d4 + 2u * c + 1u]);
            for (uint j = 0u; j < KEYS_PER_LANE; j++) {
                uint kk = lane + LANES * j;
                if (kk < nk) {
                    uvec4 kw = pool[k_base + kk * k_stride + c];
                    s[j] += dot(qa, vec4(unpackHalf2x16(kw.x), unpackHalf2x16(kw.y)))
                          + dot(qb, vec4(unpackHalf2x16(kw.z), unpackHalf2x16(kw.w)));
                }
            }
        }
        float tile_max = -1.0 / 0.0;
        for (uint j = 0u; j < KEYS_PER_LANE; j++) {
            uint kk = lane + LANES * j;
            uint key = key0 + kk;
            bool visible = q_live && kk < nk && key >= first && key <= pos;
            s[j] = visible ? s[j] * p.scale : -1.0 / 0.0;
            tile_max = max(tile_max, s[j]);
        }
        lane_buf[tid] = tile_max;
        barrier();
        float m_new = max(m, query_reduce(qi, true));
        // A query that has seen no visible key yet keeps zero weights (and
        // avoids -inf - -inf).
        float m_ref = m_new == -1.0 / 0.0 ? 0.0 : m_new;
        float correction = exp(m - m_ref);
        l *= correction;
        for (uint j = 0u; j < KEYS_PER_LANE; j++) {
            uint kk = lane + LANES * j;
            if (kk < kt) {
                float e = exp(s[j] - m_ref);
                l += e;
                weight[qi * (KT_MAX + 1u) + kk] = e;
            }
        }
        for (uint i = 0u; i < 2u * GROUPS_PER_LANE; i++) {
            acc[i] *= correction;
        }
        m = m_new;
        barrier();

        // Weighted values: only the staged keys (the rest of the tile holds
        // no row and weight 0).
        for (uint k = 0u; k < nk; k++) {
            float w = weight[qi * (KT_MAX + 1u) + k];
            for (uint i = 0u; i < GROUPS_PER_LANE; i++) {
                uint g = lane + LANES * i;
                if (g < dv8) {
                    uvec4 vw = pool[v_base + k * dv8 + g];
                    acc[2u * i] += w * vec4(unpackHalf2x16(vw.x), unpackHalf2x16(vw.y));
                    acc[2u * i + 1u] += w * vec4(unpackHalf2x16(vw.z), unpackHalf2x16(vw.w));
                }
            }
        }
    }

    // The lanes' partial denominators. (The last tile's reads of lane_buf
    // ended before its weight barrier.)
    lane_buf[tid] = l;
    barrier();
    float total = query_reduce(qi, false);
    if (q_live) {
        uint o0 = ((t0 + qi) * p.n_head + h) * p.head_dim_v;
        for (uint i = 0u; i < GROUPS_PER_LANE; i++) {
            uint g = lane + LANES * i;
            if (g < dv8) {
                vec4 a = acc[2u * i] / total;
                vec4 b = acc[2u * i + 1u] / total;
                uint o = o0 + 8u * g;
                if (p.f16_out != 0u) {
                    attn_h[o / 8u] = uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw),
                                           packHalf2x16(b.xy), packHalf2x16(b.zw));
                    continue;
                }
                attn[o] = a.x;
                attn[o + 1u] = a.y;
                attn[o + 2u] = a.z;
                attn[o + 3u] = a.w;
                attn[o + 4u] = b.x;
                attn[o + 5u] = b.y;
                attn[o + 6u] = b.z;
                attn[o + 7u] = b.w;
            }
        }
    }
}
