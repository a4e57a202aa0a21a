#version 450
// RoPE and the KV store, one workgroup per token: the query heads are
// rotated in place; the key heads are rotated and stored as f16 at the
// token's position of this layer's K cache, the values likewise into V.
// Angles come from the cos/sin table uploaded once for the context. Each
// token's position and sequence slot come from the step buffer
// (span_common.glsl): a slot's KV rows start at its first row.
#extension GL_GOOGLE_include_directive : require

#define WG_SIZE 128u
#define MAX_KV_DIM 4096u
layout(local_size_x = 128) in;

#include "span_common.glsl"

layout(std430, binding = 0) buffer Qkv { float qkv[]; };
layout(std430, binding = 1) writeonly buffer KCache { uint kc[]; };
layout(std430, binding = 2) writeonly buffer VCache { uint vc[]; };
layout(std430, binding = 3) readonly buffer Params { float params[]; };

layout(push_constant) uniform Push {
    // Index of the chunk's first token within the forward.
    uint tok_base;
    uint q_dim;
    uint k_dim;
    uint v_dim;
    uint head_dim;
    uint n_rot;
    // 0: adjacent pairs (2i, 2i+1); 1: NeoX halves (i, i + n_rot/2).
    uint neox;
    // Float offset of the table: per position n_rot/2 (cos, sin) pairs.
    uint table_off;
    // Float offsets of the chunk's k and v blocks in qkv (q starts at 0).
    uint k_off;
    uint v_off;
} p;

shared float k_row[MAX_KV_DIM];

#include "span_rope.glsl"

uvec2 pair_indices(uint j) {
    return rope_pair(j, p.n_rot, p.head_dim, p.neox != 0u);
}

vec2 angle(uint pos, uint j) {
    return rope_angle(p.table_off, pos, p.n_rot, j);
}

void main() {
    uint t = gl_WorkGroupID.x;
    uint tid = gl_LocalInvocationID.x;
    uvec2 place = token_place(p.tok_base + t);
    uint pos = place.x;
    uint kv_row = place.y + pos;
    uint half_rot = p.n_rot / 2u;

    // Queries, in place.
    uint q0 = t * p.q_dim;
    uint n_q_pairs = (p.q_dim / p.head_dim) * half_rot;
    for (uint j = tid; j < n_q_pairs; j += WG_SIZE) {
        uvec2 ab = pair_indices(j);
        vec2 cs = angle(pos, j);
        vec2 r = rope_rotate(qkv[q0 + ab.x], qkv[q0 + ab.y], cs);
        qkv[q0 + ab.x] = r.x;
        qkv[q0 + ab.y] = r.y;
    }

    // Keys: staged in shared memory, rotated there, stored as f16 pairs.
    uint k0 = p.k_off + t * p.k_dim;
    for (uint e = tid; e < p.k_dim; e += WG_SIZE) {
        k_row[e] = qkv[k0 + e];
    }
    barrier();
    uint n_k_pairs = (p.k_dim / p.head_dim) * half_rot;
    for (uint j = tid; j < n_k_pairs; j += WG_SIZE) {
        uvec2 ab = pair_indices(j);
        vec2 cs = angle(pos, j);
        vec2 r = rope_rotate(k_row[ab.x], k_row[ab.y], cs);
        k_row[ab.x] = r.x;
        k_row[ab.y] = r.y;
    }
    barrier();
    uint k_word0 = kv_row * p.k_dim / 2u;
    for (uint w = tid; w < p.k_dim / 2u; w += WG_SIZE) {
        kc[k_word0 + w] = packHalf2x16(vec2(k_row[2u * w], k_row[2u * w + 1u]));
    }

    // Values, as they are.
    uint v0 = p.v_off + t * p.v_dim;
    uint v_word0 = kv_row * p.v_dim / 2u;
    for (uint w = tid; w < p.v_dim / 2u; w += WG_SIZE) {
        vc[v_word0 + w] = packHalf2x16(vec2(qkv[v0 + 2u * w], qkv[v0 + 2u * w + 1u]));
    }
}
