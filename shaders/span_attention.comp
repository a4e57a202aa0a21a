#version 450
// Causal grouped-query attention over the device f16 KV cache, one
// workgroup per (head, token), every accumulation f32.
//
// Keys are taken in blocks of WG. Scoring spreads each key row's 16-byte
// words over consecutive threads (whole rows per subgroup, so the loads
// coalesce; eight rows' loads in flight per thread) and sums each key's
// partial products in word order; rows that are not whole 16-byte words
// give each thread one key, read a pair at a time. The block's
// weights go through shared memory into an online softmax. The weighted sum
// of values spreads the row's 16-byte words (eight f16 values; f16 pairs
// where the widths are not multiples of 8) over the threads, consecutive
// threads reading consecutive words so that the loads coalesce, and the keys
// of the block over the thread groups, eight keys' loads in flight at a
// time, merged once at the end (16-byte words measured +14% decode at 1024
// positions on llama-8b, +8% on llama-1b, against pairs). (The kernel this
// replaced scored with one scalar load per dimension and summed values one
// key at a time per thread: decode is latency-bound here, and that cost
// ~50 us per layer on the H200.) Each token reads the keys of its own
// sequence slot (span_common.glsl): positions 0..pos from the slot's first row.
//
// With ROPE_FUSED (module span_attention_rope, single-token forwards only)
// the kernel also does RoPE and the KV store, saving their dispatch and
// barrier: each workgroup rotates its query head and its KV head's key and
// writes the key and value row into the cache itself, then attends exactly
// as the plain kernel does, reading that row back. The workgroups of one KV
// group write the same bits to the same row (the rotation is the same
// arithmetic as span_rope.comp's), so whichever write a read sees, it sees
// those bits; the cache is coherent here so that a workgroup's reads see
// its own writes after its barrier. Single-token decode and multi-token
// verification (which runs RoPE as its own kernel) thus give the same bits,
// which speculative decoding relies on.
#extension GL_GOOGLE_include_directive : require

#define WG 128u
#define MAX_HEAD_DIM 256u
layout(local_size_x = 128) in;

#include "span_common.glsl"

#if defined(ROPE_FUSED)
#define KV_ACCESS coherent
#define KV_READ coherent readonly
#else
#define KV_ACCESS readonly
#define KV_READ readonly
#endif

layout(std430, binding = 0) readonly buffer Qkv { float qkv[]; };
layout(std430, binding = 1) KV_ACCESS buffer KCache { uint kc[]; };
// The same keys as 16-byte words (rows are 16-byte aligned when head_dim
// and k_dim are multiples of 8, which the host checks before it asks for
// the wide path).
layout(std430, binding = 1) KV_READ buffer KCache4 { uvec4 kc4[]; };
layout(std430, binding = 2) KV_ACCESS buffer VCache { uint vc[]; };
// The same values as 16-byte words (when head_dim_v and v_dim are
// multiples of 8).
layout(std430, binding = 2) KV_READ buffer VCache4 { uvec4 vc4[]; };
layout(std430, binding = 3) writeonly buffer Out { float attn[]; };
// The output in f16 instead (`quantise` 2): token t's row from half t *
// n_head * head_dim_v, as the int8 matrix kernel's X_F16 form reads it.
layout(std430, binding = 3) writeonly buffer OutH { uint attn_h[]; };
layout(std430, binding = 3) writeonly buffer OutH4 { uvec4 attn_h4[]; };
// The output quantised for the int8 matvec (int8_acts.glsl; rows of
// n_head * head_dim_v values), written as well when `quantise` is set.
layout(std430, binding = 6) writeonly buffer Int8Acts { uint q8[]; };
#if defined(ROPE_FUSED)
// The span's parameters: the cos/sin table.
layout(std430, binding = 5) readonly buffer Params { float params[]; };
#endif

layout(push_constant) uniform Push {
    // Index of the chunk's first token within the forward.
    uint tok_base;
    uint n_head;
    uint n_head_kv;
    uint head_dim;
    uint head_dim_v;
    uint k_dim;
    uint v_dim;
    // Sliding window in positions (0: every earlier position).
    uint window;
    float scale;
    // With ROPE_FUSED, as span_rope.comp: rotated dimensions per head, NeoX halves or
    // adjacent pairs, the cos/sin table's float offset, and where the
    // chunk's keys and values start in qkv.
    uint n_rot;
    uint neox;
    uint table_off;
    uint k_off;
    uint v_off;
    // (The plain kernel is given the same five words and ignores them.)
    // 1: also write the output quantised (decode steps whose wo takes int8
    // activations; the host sets it only where head_dim_v % 32 == 0, which
    // also puts the output on the wide path); 2: write it in f16 instead of
    // f32 (batched steps whose wo takes f16, under the same condition).
    uint quantise;
} p;

#define INT8_WRITER 1
#include "int8_acts.glsl"

shared vec4 q4[MAX_HEAD_DIM / 4u];
shared float weight[WG];
shared float reduce_buf[WG];
// Partial value sums of the thread groups: two dimensions per thread, or
// eight (in two vec4) on the wide path.
shared vec2 partial[WG];
shared vec4 partial4[2][WG];

#if defined(ROPE_FUSED)
#include "span_rope.glsl"

// The query head (0) and the key head (1) while they are rotated.
shared float head_buf[2][MAX_HEAD_DIM];

// Rotates query head h and its KV head's key of token t at `pos`, fills q4
// and stores the key and value row at KV row kv_row, visible to this
// workgroup's reads when it returns. Needs head_dim % 4 == 0 (host-checked).
// Every global load (query, key, value and cos/sin entries; MAX_HEAD_DIM =
// 2 * WG) is issued before the first barrier, so that their latencies
// overlap instead of adding up in the kernel's chain of dependent steps
// (H200: attention 12.6 -> 10.3 us per llama-8b layer). Loading the cached
// keys and values ahead as well, with this row taken from registers, was
// slower (14.4 us; 10.9 with non-coherent cache loads).
void rope_and_store(uint h, uint kv_head, uint t, uint pos, uint kv_row) {
    uint tid = gl_LocalInvocationID.x;
    uint q0 = (t * p.n_head + h) * p.head_dim;
    uint k0 = p.k_off + t * p.k_dim + kv_head * p.head_dim;
    uint v0 = p.v_off + t * p.v_dim + kv_head * p.head_dim_v;
    uint half_rot = p.n_rot / 2u;
    float qe[2];
    float ke[2];
    vec2 cs[2];
    for (uint r = 0u; r < 2u; r++) {
        uint e = tid + r * WG;
        if (e < p.head_dim) {
            qe[r] = qkv[q0 + e];
            ke[r] = qkv[k0 + e];
        }
        if (e < 2u * half_rot) {
            cs[r] = rope_angle(p.table_off, pos, p.n_rot, e % half_rot);
        }
    }
    vec2 ve = vec2(0.0);
    if (tid < p.head_dim_v / 2u) {
        ve = vec2(qkv[v0 + 2u * tid], qkv[v0 + 2u * tid + 1u]);
    }
    for (uint r = 0u; r < 2u; r++) {
        uint e = tid + r * WG;
        if (e < p.head_dim) {
            head_buf[0][e] = qe[r];
            head_buf[1][e] = ke[r];
        }
    }
    barrier();
    for (uint r = 0u; r < 2u; r++) {
        uint j = tid + r * WG;
        if (j < 2u * half_rot) {
            uint which = j / half_rot;
            uint jj = j % half_rot;
            uvec2 ab = rope_pair(jj, p.n_rot, p.head_dim, p.neox != 0u);
            vec2 rot = rope_rotate(head_buf[which][ab.x], head_buf[which][ab.y], cs[r]);
            head_buf[which][ab.x] = rot.x;
            head_buf[which][ab.y] = rot.y;
        }
    }
    barrier();
    if (tid < p.head_dim / 4u) {
        uint e = 4u * tid;
        q4[tid] = vec4(head_buf[0][e], head_buf[0][e + 1u], head_buf[0][e + 2u], head_buf[0][e + 3u]);
        uint kw = kv_row * (p.k_dim / 2u) + kv_head * (p.head_dim / 2u) + 2u * tid;
        kc[kw] = packHalf2x16(vec2(head_buf[1][e], head_buf[1][e + 1u]));
        kc[kw + 1u] = packHalf2x16(vec2(head_buf[1][e + 2u], head_buf[1][e + 3u]));
    }
    if (tid < p.head_dim_v / 2u) {
        vc[kv_row * (p.v_dim / 2u) + kv_head * (p.head_dim_v / 2u) + tid] = packHalf2x16(ve);
    }
    memoryBarrierBuffer();
    barrier();
}
#endif

// Max (is_max) or sum of every thread's v, the same result in all threads.
float block_reduce(float v, bool is_max) {
    uint tid = gl_LocalInvocationID.x;
    reduce_buf[tid] = v;
    barrier();
    for (uint stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (tid < stride) {
            float o = reduce_buf[tid + stride];
            reduce_buf[tid] = is_max ? max(reduce_buf[tid], o) : reduce_buf[tid] + o;
        }
        barrier();
    }
    float r = reduce_buf[0];
    barrier();
    return r;
}

// Dot product of q with key j, one f16 pair at a time (rows whose widths
// are not multiples of 8).
float key_dot(uint j, uint k_head_word) {
    uint kw = j * (p.k_dim / 2u) + k_head_word;
    float d = 0.0;
    for (uint e2 = 0u; e2 < p.head_dim / 2u; e2++) {
        vec2 kk = unpackHalf2x16(kc[kw + e2]);
        vec4 qq = q4[e2 / 2u];
        d += (e2 & 1u) == 0u ? dot(qq.xy, kk) : dot(qq.zw, kk);
    }
    return d;
}

// Partial dot products of the block's keys, one per 16-byte word of a row.
shared float key_part[WG][MAX_HEAD_DIM / 8u];

// The scaled scores of keys key_row0 .. key_row0 + n_keys - 1 (thread i
// returns key i's; -inf past the end) when rows are whole 16-byte words:
// a row's words go to consecutive threads, so a subgroup reads whole rows
// (the loads coalesce) and eight passes' loads are in flight at a time;
// each key's partial products are then summed in word order, the order of
// a one-thread dot product. Every thread must call it (it has a barrier).
float wide_scores(uint key_row0, uint n_keys, uint k_head_word) {
    uint tid = gl_LocalInvocationID.x;
    uint n4 = p.head_dim / 8u;
    uint per_pass = WG / n4;
    uint c = tid % n4;
    uint kq = tid / n4;
    bool in_pass = kq < per_pass;
    vec4 qa = q4[2u * c];
    vec4 qb = q4[2u * c + 1u];
    uint row4 = p.k_dim / 8u;
    uint head4 = k_head_word / 4u + c;
    uint n_pass = (n_keys + per_pass - 1u) / per_pass;
    for (uint pass0 = 0u; pass0 < n_pass; pass0 += 8u) {
        uvec4 r[8];
        for (uint i = 0u; i < 8u; i++) {
            uint k = (pass0 + i) * per_pass + kq;
            if (in_pass && k < n_keys) {
                r[i] = kc4[(key_row0 + k) * row4 + head4];
            }
        }
        for (uint i = 0u; i < 8u; i++) {
            uint k = (pass0 + i) * per_pass + kq;
            if (in_pass && k < n_keys) {
                vec2 k0 = unpackHalf2x16(r[i].x);
                vec2 k1 = unpackHalf2x16(r[i].y);
                vec2 k2 = unpackHalf2x16(r[i].z);
                vec2 k3 = unpackHalf2x16(r[i].w);
                key_part[k][c] = dot(qa, vec4(k0, k1)) + dot(qb, vec4(k2, k3));
            }
        }
    }
    barrier();
    if (tid >= n_keys) {
        return -1.0 / 0.0;
    }
    float d = 0.0;
    for (uint j = 0u; j < n4; j++) {
        d += key_part[tid][j];
    }
    return d * p.scale;
}


void main() {
    uint h = gl_WorkGroupID.x;
    uint t = gl_WorkGroupID.y;
    uint tid = gl_LocalInvocationID.x;
    uvec2 place = token_place(p.tok_base + t);
    uint pos = place.x;
    uint row0 = place.y;
    uint kv_head = h / (p.n_head / p.n_head_kv);
    uint first = (p.window > 0u && pos + 1u > p.window) ? pos + 1u - p.window : 0u;
    bool wide = (p.head_dim % 8u) == 0u && (p.k_dim % 8u) == 0u;

#if defined(ROPE_FUSED)
    rope_and_store(h, kv_head, t, pos, row0 + pos);
#else
    uint q0 = (t * p.n_head + h) * p.head_dim;
    if (tid < MAX_HEAD_DIM / 4u) {
        vec4 v = vec4(0.0);
        for (uint c = 0u; c < 4u; c++) {
            uint e = 4u * tid + c;
            if (e < p.head_dim) {
                v[c] = qkv[q0 + e];
            }
        }
        q4[tid] = v;
    }
    barrier();
#endif
    uint end = pos + 1u;

    // Value layout: thread (group g, lane w) sums word w (two dims) of the
    // value rows of keys g, g + groups, ... of each block, or on the wide
    // path 16-byte word w (eight dims): a row then takes a quarter as many
    // threads, so there are four times as many groups and each thread sums
    // a quarter as many keys, eight loads in flight at a time (the value
    // sum grows with the context: +14% decode at 1024 positions on the H200).
    bool wide_v = (p.head_dim_v % 8u) == 0u && (p.v_dim % 8u) == 0u;
    uint words = p.head_dim_v / 2u;
    uint lanes = wide_v ? words / 4u : words;
    uint groups = max(WG / lanes, 1u);
    uint g = tid / lanes;
    uint w = tid % lanes;
    bool v_active = g < groups && w < lanes;
    uint v_head_word = kv_head * words;
    uint v_row_words = p.v_dim / 2u;
    uint k_head_word = kv_head * (p.head_dim / 2u);

    vec2 acc = vec2(0.0);
    vec4 acc_lo = vec4(0.0);
    vec4 acc_hi = vec4(0.0);
    float m = -1.0 / 0.0;
    float l = 0.0;
    for (uint key0 = first; key0 < end; key0 += WG) {
        uint n_keys = min(WG, end - key0);
        float s = -1.0 / 0.0;
        if (wide) {
            s = wide_scores(row0 + key0, n_keys, k_head_word);
        } else if (tid < n_keys) {
            s = key_dot(row0 + key0 + tid, k_head_word) * p.scale;
        }
        float m_new = max(m, block_reduce(s, true));
        float e = tid < n_keys ? exp(s - m_new) : 0.0;
        weight[tid] = e;
        float correction = exp(m - m_new);
        l = l * correction + block_reduce(e, false);
        acc *= correction;
        acc_lo *= correction;
        acc_hi *= correction;
        // block_reduce ended with a barrier, so every weight is visible.
        if (v_active && wide_v) {
            uint i = g;
            uint head4 = v_head_word / 4u + w;
            // Eight keys per step: their loads are in flight together.
            for (; i + 7u * groups < n_keys; i += 8u * groups) {
                uvec4 r[8];
                for (uint k = 0u; k < 8u; k++) {
                    r[k] = vc4[(row0 + key0 + i + k * groups) * (v_row_words / 4u) + head4];
                }
                for (uint k = 0u; k < 8u; k++) {
                    float wt = weight[i + k * groups];
                    acc_lo += wt * vec4(unpackHalf2x16(r[k].x), unpackHalf2x16(r[k].y));
                    acc_hi += wt * vec4(unpackHalf2x16(r[k].z), unpackHalf2x16(r[k].w));
                }
            }
            for (; i < n_keys; i += groups) {
                uvec4 r = vc4[(row0 + key0 + i) * (v_row_words / 4u) + head4];
                float wt = weight[i];
                acc_lo += wt * vec4(unpackHalf2x16(r.x), unpackHalf2x16(r.y));
                acc_hi += wt * vec4(unpackHalf2x16(r.z), unpackHalf2x16(r.w));
            }
        } else if (v_active) {
            uint i = g;
            // Four keys per step: their loads are in flight together.
            for (; i + 3u * groups < n_keys; i += 4u * groups) {
                uint r0 = (row0 + key0 + i) * v_row_words + v_head_word + w;
                uint r1 = r0 + groups * v_row_words;
                uint r2 = r1 + groups * v_row_words;
                uint r3 = r2 + groups * v_row_words;
                vec2 v0 = unpackHalf2x16(vc[r0]);
                vec2 v1 = unpackHalf2x16(vc[r1]);
                vec2 v2 = unpackHalf2x16(vc[r2]);
                vec2 v3 = unpackHalf2x16(vc[r3]);
                acc += weight[i] * v0 + weight[i + groups] * v1;
                acc += weight[i + 2u * groups] * v2 + weight[i + 3u * groups] * v3;
            }
            for (; i < n_keys; i += groups) {
                acc += weight[i] * unpackHalf2x16(vc[(row0 + key0 + i) * v_row_words + v_head_word + w]);
            }
        }
        m = m_new;
        barrier();
    }

    // Merge the groups' partial sums.
    if (wide_v) {
        partial4[0][tid] = v_active ? acc_lo : vec4(0.0);
        partial4[1][tid] = v_active ? acc_hi : vec4(0.0);
        barrier();
        if (tid < lanes) {
            vec4 lo = partial4[0][tid];
            vec4 hi = partial4[1][tid];
            for (uint k = 1u; k < groups; k++) {
                lo += partial4[0][k * lanes + tid];
                hi += partial4[1][k * lanes + tid];
            }
            uint o0 = (t * p.n_head + h) * p.head_dim_v + 8u * tid;
            if (p.quantise == 2u) {
                vec4 a = lo / l;
                vec4 b = hi / l;
                attn_h4[o0 / 8u] = uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw),
                                         packHalf2x16(b.xy), packHalf2x16(b.zw));
            } else {
                for (uint c = 0u; c < 4u; c++) {
                    attn[o0 + c] = lo[c] / l;
                    attn[o0 + 4u + c] = hi[c] / l;
                }
            }
            // The same values for the quantisation below.
            partial4[0][tid] = vec4(lo.x / l, lo.y / l, lo.z / l, lo.w / l);
            partial4[1][tid] = vec4(hi.x / l, hi.y / l, hi.z / l, hi.w / l);
        }
        if (p.quantise == 1u) {
            // Uniform: every thread reaches the barrier. Block j of the
            // head is lanes 4j .. 4j + 3 (eight values each).
            barrier();
            if (tid < p.head_dim_v / 32u) {
                vec4 v[8];
                for (uint k = 0u; k < 4u; k++) {
                    v[2u * k] = partial4[0][4u * tid + k];
                    v[2u * k + 1u] = partial4[1][4u * tid + k];
                }
                uint per_row = p.n_head * p.head_dim_v;
                store_int8_block(v, t, h * (p.head_dim_v / 32u) + tid, per_row);
            }
        }
        return;
    }
    partial[tid] = v_active ? acc : vec2(0.0);
    barrier();
    if (tid < words) {
        vec2 sum = partial[tid];
        for (uint k = 1u; k < groups; k++) {
            sum += partial[k * words + tid];
        }
        uint o0 = (t * p.n_head + h) * p.head_dim_v + 2u * tid;
        if (p.quantise == 2u) {
            attn_h[o0 / 2u] = packHalf2x16(sum / l);
        } else {
            attn[o0] = sum.x / l;
            attn[o0 + 1u] = sum.y / l;
        }
    }
}
