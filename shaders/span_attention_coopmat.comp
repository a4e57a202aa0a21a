#version 450
// Causal grouped-query attention for the multi-token chunks of a plain
// forward on cooperative matrices (prefill): the scores and the weighted
// value sums are f16 x f16 -> f32 fragment products, with the softmax kept
// online (running maximum and denominator per query) as in
// span_attention_tiled.comp, which it replaces where the device has the
// matrix units; same bindings and push constants.
//
// One workgroup per (query head, block of QB = 64 consecutive tokens), four
// subgroups of 32 invocations, each owning 16 of the block's queries. The
// queries are staged once as f16 and held as A fragments (HEAD_DIM / 16 of
// them). Per tile of KT = 32 keys, the workgroup stages the key and value
// rows (zeros past the chunk's last position), then each subgroup:
//   - multiplies its queries by the keys (two 16 x 16 score fragments),
//     stores them to shared memory;
//   - two invocations per query row mask, scale and exponentiate its 32
//     scores against the row's new maximum, write the weights as f16 and
//     the factor exp(old max - new max) by which the row's earlier sums
//     shrink;
//   - scales its output fragments by those factors (a fragment whose row r
//     holds row r's factor, multiplied component-wise) and adds weights x
//     values.
// At the end the output fragments are scaled by 1 / denominator and the
// block's live rows written out. Each query sees the keys it would in the
// per-token kernel (causal, sliding window), so only the rounding differs:
// queries and weights in f16 instead of f32.
//
// HEAD_DIM (64 or 128, a compile-time define: the fragment arrays must be
// indexed by constants, or the driver keeps them in local memory) is both
// head_dim and head_dim_v; the host checks the shape and the subgroup size
// before choosing this kernel.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

#if !defined(HEAD_DIM)
#error "define HEAD_DIM"
#endif

#define WARPS 4u
#define WG 128u
// Queries per workgroup (16 per subgroup) and keys per tile.
#define QB 64u
#define KT 32u
// Fragments along a head.
#define DF (HEAD_DIM / 16u)
// 16-byte words per staged f16 row: the head and 16 bytes of padding, so
// that consecutive rows start in different banks.
#define ROW_WORDS (HEAD_DIM / 8u + 1u)
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
    // As span_attention_tiled.comp.
    uint tok_base;
    uint n_head;
    uint n_head_kv;
    uint head_dim;
    uint head_dim_v;
    uint k_dim;
    uint v_dim;
    uint window;
    float scale;
    uint n_tok;
    // 1: write the output in f16 (attn_h) instead of f32.
    uint f16_out;
} p;

#define FragA coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define FragB coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define Acc coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

// The block's queries (QB rows) at the start; then the tile's keys (KT
// rows) followed by its values (KT rows).
shared uvec4 rows[QB * ROW_WORDS];
// Per subgroup: its 16 x KT scores (row-major), later one 16 x 16 output
// fragment on its way out.
shared float scores[WARPS * 16u * KT];
// Per subgroup: the 16 x KT weights as f16, KT / 8 words per row.
shared uvec4 weights[WARPS * 16u * KT / 8u];
// Per subgroup: 16 x 16, row r filled with row r's factor.
shared float factors[WARPS * 256u];

// Orders a subgroup's shared-memory writes before its reads.
#define SUBGROUP_SYNC() controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared, gl_SemanticsAcquireRelease)

// The first position a query at `pos` sees.
uint first_visible(uint pos) {
    return (p.window > 0u && pos + 1u > p.window) ? pos + 1u - p.window : 0u;
}

uvec4 pack8(vec4 lo, vec4 hi) {
    return uvec4(packHalf2x16(lo.xy), packHalf2x16(lo.zw), packHalf2x16(hi.xy), packHalf2x16(hi.zw));
}

// Fills row `qr` of this subgroup's factor matrix with f (the row's two
// invocations write eight columns each).
void put_factor(uint warp, uint qr, uint half_, float f) {
    [[unroll]] for (uint c = 0u; c < 8u; c++) {
        factors[warp * 256u + qr * 16u + half_ * 8u + c] = f;
    }
}

void main() {
    uint h = gl_WorkGroupID.x;
    // The last blocks of a chunk see the most keys: lowest ids, started first.
    uint t0 = (gl_NumWorkGroups.y - 1u - gl_WorkGroupID.y) * QB;
    uint tid = gl_LocalInvocationID.x;
    uint warp = gl_SubgroupID;
    uint lane = gl_SubgroupInvocationID;
    uint nq = min(QB, p.n_tok - t0);
    uint kv_head = h / (p.n_head / p.n_head_kv);

    // This invocation's query row (of its subgroup's 16) and which half of
    // a tile's keys it scores.
    uint qr = lane / 2u;
    uint half_ = lane % 2u;
    uint qi = warp * 16u + qr;
    bool q_live = qi < nq;
    uint pos = token_place(p.tok_base + t0 + min(qi, nq - 1u)).x;
    uint first = first_visible(pos);
    uvec2 block_place = token_place(p.tok_base + t0);
    uint row0 = block_place.y;
    uint block_first = first_visible(block_place.x);
    uint block_end = token_place(p.tok_base + t0 + nq - 1u).x + 1u;

    const uint d8 = HEAD_DIM / 8u;
    uint k_row_words = p.k_dim / 8u;
    uint v_row_words = p.v_dim / 8u;
    uint k_head = kv_head * d8;
    uint v_head = kv_head * d8;

    // The block's queries as f16; missing rows of a partial block are zeros.
    for (uint i = tid; i < QB * d8; i += WG) {
        uint r = i / d8;
        uint c = i % d8;
        vec4 lo = vec4(0.0);
        vec4 hi = vec4(0.0);
        if (r < nq) {
            uint q0 = ((t0 + r) * p.n_head + h) * HEAD_DIM + 8u * c;
            lo = vec4(qkv[q0], qkv[q0 + 1u], qkv[q0 + 2u], qkv[q0 + 3u]);
            hi = vec4(qkv[q0 + 4u], qkv[q0 + 5u], qkv[q0 + 6u], qkv[q0 + 7u]);
        }
        rows[r * ROW_WORDS + c] = pack8(lo, hi);
    }
    barrier();
    FragA q[DF];
    [[unroll]] for (uint kk = 0u; kk < DF; kk++) {
        coopMatLoad(q[kk], rows, warp * 16u * ROW_WORDS + 2u * kk, ROW_WORDS, gl_CooperativeMatrixLayoutRowMajor);
    }
    Acc o[DF];
    [[unroll]] for (uint f = 0u; f < DF; f++) {
        o[f] = Acc(0.0);
    }
    float m = -1.0 / 0.0;
    float l = 0.0;
    const uint v_rows = KT * ROW_WORDS;

    for (uint key0 = block_first; key0 < block_end; key0 += KT) {
        uint nk = min(KT, block_end - key0);
        // Every subgroup is done with the rows (queries, or the last tile).
        barrier();
        for (uint i = tid; i < KT * d8; i += WG) {
            uint key = i / d8;
            uint c = i % d8;
            uvec4 k = uvec4(0u);
            uvec4 v = uvec4(0u);
            if (key < nk) {
                uint row = row0 + key0 + key;
                k = kc4[row * k_row_words + k_head + c];
                v = vc4[row * v_row_words + v_head + c];
            }
            rows[key * ROW_WORDS + c] = k;
            rows[v_rows + key * ROW_WORDS + c] = v;
        }
        barrier();

        // Scores: queries x keys^T (keys staged by row are the columns of B).
        Acc s[KT / 16u];
        [[unroll]] for (uint n = 0u; n < KT / 16u; n++) {
            s[n] = Acc(0.0);
            [[unroll]] for (uint kk = 0u; kk < DF; kk++) {
                FragB kb;
                coopMatLoad(kb, rows, n * 16u * ROW_WORDS + 2u * kk, ROW_WORDS, gl_CooperativeMatrixLayoutColumnMajor);
                s[n] = coopMatMulAdd(q[kk], kb, s[n]);
            }
            coopMatStore(s[n], scores, warp * 16u * KT + 16u * n, KT, gl_CooperativeMatrixLayoutRowMajor);
        }
        SUBGROUP_SYNC();

        // Softmax of this row's half of the tile.
        float sv[16];
        float tile_max = -1.0 / 0.0;
        [[unroll]] for (uint j = 0u; j < 16u; j++) {
            uint kk = half_ * 16u + j;
            uint key = key0 + kk;
            bool visible = q_live && kk < nk && key >= first && key <= pos;
            sv[j] = visible ? scores[warp * 16u * KT + qr * KT + kk] * p.scale : -1.0 / 0.0;
            tile_max = max(tile_max, sv[j]);
        }
        tile_max = max(tile_max, subgroupShuffleXor(tile_max, 1u));
        float m_new = max(m, tile_max);
        // A row that has seen no visible key yet keeps zero weights (and
        // avoids -inf - -inf).
        float m_ref = m_new == -1.0 / 0.0 ? 0.0 : m_new;
        float shrink = exp(m - m_ref);
        float sum = 0.0;
        [[unroll]] for (uint w = 0u; w < 2u; w++) {
            vec4 e[2];
            [[unroll]] for (uint j = 0u; j < 8u; j++) {
                float x = exp(sv[8u * w + j] - m_ref);
                sum += x;
                e[j / 4u][j % 4u] = x;
            }
            weights[warp * 16u * (KT / 8u) + qr * (KT / 8u) + half_ * 2u + w] = pack8(e[0], e[1]);
        }
        sum += subgroupShuffleXor(sum, 1u);
        l = l * shrink + sum;
        m = m_new;
        put_factor(warp, qr, half_, shrink);
        SUBGROUP_SYNC();

        Acc fac;
        coopMatLoad(fac, factors, warp * 256u, 16u, gl_CooperativeMatrixLayoutRowMajor);
        [[unroll]] for (uint f = 0u; f < DF; f++) {
            o[f] = o[f] * fac;
        }
        [[unroll]] for (uint kk = 0u; kk < KT / 16u; kk++) {
            FragA pw;
            coopMatLoad(pw, weights, warp * 16u * (KT / 8u) + 2u * kk, KT / 8u, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint f = 0u; f < DF; f++) {
                FragB vb;
                coopMatLoad(vb, rows, v_rows + kk * 16u * ROW_WORDS + 2u * f, ROW_WORDS, gl_CooperativeMatrixLayoutRowMajor);
                o[f] = coopMatMulAdd(pw, vb, o[f]);
            }
        }
        // The next tile's score and factor writes follow its workgroup barrier.
    }

    // Normalise by the denominators and write the live rows.
    SUBGROUP_SYNC();
    put_factor(warp, qr, half_, l > 0.0 ? 1.0 / l : 0.0);
    SUBGROUP_SYNC();
    Acc inv;
    coopMatLoad(inv, factors, warp * 256u, 16u, gl_CooperativeMatrixLayoutRowMajor);
    [[unroll]] for (uint f = 0u; f < DF; f++) {
        Acc out_f = o[f] * inv;
        coopMatStore(out_f, scores, warp * 16u * KT, 16u, gl_CooperativeMatrixLayoutRowMajor);
        SUBGROUP_SYNC();
        if (q_live) {
            uint o0 = ((t0 + qi) * p.n_head + h) * HEAD_DIM + 16u * f + 8u * half_;
            uint s0 = warp * 16u * KT + qr * 16u + 8u * half_;
            if (p.f16_out != 0u) {
                // o0 is a multiple of 8: one word of 8 halves.
                uvec4 w;
                [[unroll]] for (uint c = 0u; c < 4u; c++) {
                    w[c] = packHalf2x16(vec2(scores[s0 + 2u * c], scores[s0 + 2u * c + 1u]));
                }
                attn_h[o0 / 8u] = w;
            } else {
                [[unroll]] for (uint c = 0u; c < 8u; c++) {
                    attn[o0 + c] = scores[s0 + c];
                }
            }
        }
        SUBGROUP_SYNC();
    }
}
