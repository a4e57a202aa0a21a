#version 450
// Causal grouped-query attention over the device f16 KV cache, one
// workgroup per (head, token): blocks of BLOCK keys are scored (one key per
// thread), then folded into an online softmax; every accumulation is f32.
#extension GL_GOOGLE_include_directive : require

#define BLOCK 64u
#define MAX_HEAD_DIM 256u
#define DIMS_PER_THREAD (MAX_HEAD_DIM / BLOCK)
layout(local_size_x = 64) in;

#include "span_common.glsl"

layout(std430, binding = 0) readonly buffer Qkv { float qkv[]; };
layout(std430, binding = 1) readonly buffer KCache { uint kc[]; };
layout(std430, binding = 2) readonly buffer VCache { uint vc[]; };
layout(std430, binding = 3) writeonly buffer Out { float attn[]; };

layout(push_constant) uniform Push {
    // Position of the chunk's first token.
    uint pos_base;
    uint n_head;
    uint n_head_kv;
    uint head_dim;
    uint head_dim_v;
    uint k_dim;
    uint v_dim;
    // Sliding window in positions (0: every earlier position).
    uint window;
    float scale;
} p;

shared float q_row[MAX_HEAD_DIM];
shared float weight[BLOCK];

void main() {
    uint h = gl_WorkGroupID.x;
    uint t = gl_WorkGroupID.y;
    uint tid = gl_LocalInvocationID.x;
    uint pos = p.pos_base + t;
    uint kv_head = h / (p.n_head / p.n_head_kv);
    uint first = (p.window > 0u && pos + 1u > p.window) ? pos + 1u - p.window : 0u;

    uint q0 = (t * p.n_head + h) * p.head_dim;
    for (uint e = tid; e < p.head_dim; e += BLOCK) {
        q_row[e] = qkv[q0 + e];
    }
    barrier();

    float acc[DIMS_PER_THREAD];
    for (uint c = 0u; c < DIMS_PER_THREAD; c++) {
        acc[c] = 0.0;
    }
    float m = -1.0 / 0.0;
    float l = 0.0;
    uint k_head_word = kv_head * p.head_dim / 2u;
    uint v_head = kv_head * p.head_dim_v;

    for (uint key0 = first; key0 <= pos; key0 += BLOCK) {
        uint n_keys = min(BLOCK, pos + 1u - key0);
        uint j = key0 + tid;
        float s = -1.0 / 0.0;
        if (tid < n_keys) {
            uint kw = j * p.k_dim / 2u + k_head_word;
            float d = 0.0;
            for (uint e2 = 0u; e2 < p.head_dim / 2u; e2++) {
                vec2 kk = unpackHalf2x16(kc[kw + e2]);
                d += q_row[2u * e2] * kk.x + q_row[2u * e2 + 1u] * kk.y;
            }
            s = d * p.scale;
        }
        weight[tid] = s;
        barrier();
        float block_max = weight[0];
        for (uint i = 1u; i < n_keys; i++) {
            block_max = max(block_max, weight[i]);
        }
        float m_new = max(m, block_max);
        float correction = exp(m - m_new);
        barrier();
        weight[tid] = tid < n_keys ? exp(s - m_new) : 0.0;
        barrier();
        float block_sum = 0.0;
        for (uint i = 0u; i < n_keys; i++) {
            block_sum += weight[i];
        }
        l = l * correction + block_sum;
        for (uint c = 0u; c < DIMS_PER_THREAD; c++) {
            uint d = tid + c * BLOCK;
            if (d < p.head_dim_v) {
                float a = acc[c] * correction;
                for (uint i = 0u; i < n_keys; i++) {
                    uint e = (key0 + i) * p.v_dim + v_head + d;
                    a += weight[i] * kv_load(vc[e >> 1u], e);
                }
                acc[c] = a;
            }
        }
        m = m_new;
        barrier();
    }

    uint o0 = (t * p.n_head + h) * p.head_dim_v;
    for (uint c = 0u; c < DIMS_PER_THREAD; c++) {
        uint d = tid + c * BLOCK;
        if (d < p.head_dim_v) {
            attn[o0 + d] = acc[c] / l;
        }
    }
}
