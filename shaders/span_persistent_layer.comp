#version 450
// One span layer of a single-token decode step in ONE dispatch of resident
// workgroups (span/persistent.rs, FISH_GPU_PERSISTENT): the five dependent
// stages of a llama layer separated by grid-wide waits instead of dispatch
// boundaries, each workgroup loading its next block's weights before it
// sums the current one, across stages too, so the next stage's first
// weights stream during the wait. The form of the persistent_decode bench
// (persistent_decode_layer.comp), on the span's own buffers:
//   0 q/k/v: attention norm of x in the staging, q | k | v into the scratch;
//   1 attention: one block per query head: RoPE from the span's cos/sin
//     table on its q and its key-value head's k (the group's first query
//     head stores k and v as f16 at the token's KV row), softmax(q k *
//     attn_scale) over the positions up to the token's, the weighted values
//     into the scratch;
//   2 wo: x += wo times the attention output;
//   3 gate/up: feed-forward norm of x in the staging, gate and up rows
//     alternating (row 2i gate i, 2i + 1 up i), SiLU(gate) * up of each pair
//     into the scratch;
//   4 down: x += down times that.
// Each matrix is Q4_K or Q6_K (the Q4_K_M mix; bit t of p.types: tensor t
// is Q6_K), in its own binding. Both types are read as units of 32 values
// in two runs of 16 that share a scale, so a phase's blocks are cut alike
// whatever its rows' types.
//
// The staged inputs are rounded to f16 (shared memory holds 14336 of them);
// scores of at most 7168 positions share that memory (the host keeps the
// dispatch to those). A wait that outlasts SPIN_LIMIT polls gives up and
// raises the failure word (scratch word 0); the host then discards the
// forward.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_memory_scope_semantics : require

#define TYPE_Q4_K
layout(local_size_x = 128) in;
const uint WG = 128u;
// Units per invocation and block.
const uint MAXU = 4u;
const uint MAX_IN = 14336u;
const uint MAX_D = 128u;

// span/persistent.rs `Push`; n_in is n_embd, named so for dequant.glsl.
layout(push_constant) uniform Layer {
    uint n_in;
    uint n_ff;
    // n_head | n_kv_heads << 16.
    uint heads;
    uint head_dim;
    float eps;
    float attn_scale;
    uint groups_x;
    // Bit 0: NeoX RoPE halves (i, i + head_dim / 2), else adjacent pairs.
    uint flags;
    // Bit t: tensor t (q, k, v, wo, gate, up, down) is Q6_K, else Q4_K.
    uint types;
    // Float offsets in the parameters of the two norms and the RoPE table.
    uint attn_norm;
    uint ffn_norm;
    uint rope_table;
    // Scratch words of this layer's arrival counter and of the first slot.
    uint counter_word;
    uint slots0;
    // The phases this dispatch runs: first | end << 16 (0: all five). A
    // layer recorded as one dispatch per phase, with pipeline barriers
    // between them, runs the same code without grid-wide waits.
    uint phase_range;
} p;

// The layer's matrices. dequant.glsl and matvec_units.glsl (Q4_K) read
// binding 0 as `w` and `w4`.
layout(std430, binding = 0) readonly buffer Wq { uint w[]; };
layout(std430, binding = 0) readonly buffer Wq4 { uvec4 w4[]; };
layout(std430, binding = 1) readonly buffer Wk4 { uvec4 wk4[]; };
layout(std430, binding = 2) readonly buffer Wv4 { uvec4 wv4[]; };
layout(std430, binding = 3) readonly buffer Wo4 { uvec4 wo4[]; };
layout(std430, binding = 4) readonly buffer Wgate4 { uvec4 wgate4[]; };
layout(std430, binding = 5) readonly buffer Wup4 { uvec4 wup4[]; };
layout(std430, binding = 6) readonly buffer Wdown4 { uvec4 wdown4[]; };
#include "dequant.glsl"
#include "matvec_units.glsl"

// The residual stream (token 0), read and written across workgroups.
layout(std430, binding = 7) coherent buffer X { float x_f[]; };
layout(std430, binding = 7) coherent buffer X4 { vec4 x_f4[]; };
// The layer's f16 keys and values, two per word, one row per position.
layout(std430, binding = 8) buffer Keys { uint k_cache[]; };
layout(std430, binding = 8) buffer Keys4 { uvec4 k_cache4[]; };
layout(std430, binding = 9) buffer Values { uint v_cache[]; };
layout(std430, binding = 10) readonly buffer Params { float params[]; };
layout(std430, binding = 10) readonly buffer Params4 { vec4 params4[]; };
// The scratch: the failure word, the arrival counters, the vector slots.
layout(std430, binding = 11) coherent buffer Scratch { float vec_f[]; };
layout(std430, binding = 11) coherent buffer Scratch4 { vec4 vec_f4[]; };
layout(std430, binding = 11) volatile buffer Arrivals { uint arrivals[]; };
layout(std430, binding = 12) readonly buffer Step { uint step_words[]; };
#include "span_rope.glsl"

#define COUNTER_WORD p.counter_word
#define FAILURE_WORD 0u
const uint SPIN_LIMIT = 1u << 22;
// Loads of the staging a thread issues together.
const uint STAGE_LOADS = 8u;

const uint QKV = 0u;
const uint ATTN = 1u;
const uint WO = 2u;
const uint GATE_UP = 3u;
const uint DOWN = 4u;

// Tensors, in binding order.
const uint T_Q = 0u;
const uint T_K = 1u;
const uint T_V = 2u;
const uint T_WO = 3u;
const uint T_GATE = 4u;
const uint T_DOWN = 6u;

shared uint xs[MAX_IN / 2u];
shared float partial[WG * MAXU / 4u];
shared float row_sums[WG * MAXU / 32u];
shared float reduce_parts[WG];
shared float kc[MAX_D];
shared float vc[MAX_D];
shared float qr[MAX_D];
shared float out_parts[2u * WG];
shared float stage_scale;

uint n_head() {
    return p.heads & 0xFFFFu;
}
uint n_kv() {
    return p.heads >> 16;
}
uint kv_dim() {
    return n_kv() * p.head_dim;
}
uint q_dim() {
    return n_head() * p.head_dim;
}

// Scratch slots: q | k | v, the attention output, SiLU(gate) * up; each
// starts on a 256-byte boundary.
uint qkv_slot() {
    return p.slots0;
}
uint attn_slot() {
    return qkv_slot() + (q_dim() + 2u * kv_dim() + 63u) / 64u * 64u;
}
uint act_slot() {
    return attn_slot() + (q_dim() + 63u) / 64u * 64u;
}

bool is_q6(uint t) {
    return ((p.types >> t) & 1u) != 0u;
}

// Bytes of a row of n values of tensor t in the device layout (rows start
// on 16-byte boundaries; a Q6_K row is its 208-byte bodies, then the f16 ds).
uint row_stride(uint t, uint n) {
    uint nb = n / 256u;
    return is_q6(t) ? (210u * nb + 15u) / 16u * 16u : 144u * nb;
}

// 16 bytes of tensor t (a uniform switch in all but the blocks that
// straddle two tensors).
uvec4 wload4(uint t, uint i) {
    switch (t) {
    case 0u: return w4[i];
    case 1u: return wk4[i];
    case 2u: return wv4[i];
    case 3u: return wo4[i];
    case 4u: return wgate4[i];
    case 5u: return wup4[i];
    default: return wdown4[i];
    }
}

// A unit of 32 values of either type, two runs of 16 sharing a scale.
// Q4_K (unit v = u % 8 of super-block u / 8): a the block head, b qs bytes
// 16v .. 16v + 15, e the chunk v / 2; run 0 the low nibbles, run 1 the high
// ones (matvec_units.glsl's Q4_K unit). Q6_K: half n = v / 4, quarters qq
// and qq + 2 with qq = (v / 2) % 2, l from 16 (v % 2): a the ql bytes
// 64n + 32qq + 16 (v % 2) .., b the qh bytes 32n + 16 (v % 2) .., c the 16
// int8 scales, e the f16 d (bits 0..15) and v (16..18); run r is quarter
// qq + 2r, the low (r = 0) or high nibbles of a.
struct RUnit {
    uvec4 a;
    uvec4 b;
    uvec4 c;
    uint e;
};

RUnit load_runit(uint t, uint row_byte, uint u, uint nb) {
    RUnit un;
    uint sb = u / 8u;
    uint v = u % 8u;
    if (is_q6(t)) {
        uint body16 = (row_byte + 208u * sb) / 16u;
        uint n = v / 4u;
        uint qq = (v / 2u) % 2u;
        uint hl = v % 2u;
        un.a = wload4(t, body16 + 4u * n + 2u * qq + hl);
        un.b = wload4(t, body16 + 8u + 2u * n + hl);
        un.c = wload4(t, body16 + 12u);
        // The ds follow the bodies on a 16-byte boundary.
        uint d_word = (row_byte + 208u * nb) / 4u + sb / 2u;
        uint dw = wload4(t, d_word / 4u)[d_word % 4u];
        un.e = ((dw >> (16u * (sb % 2u))) & 0xFFFFu) | (v << 16);
    } else {
        uint block16 = (row_byte + 144u * sb) / 16u;
        un.a = wload4(t, block16);
        un.b = wload4(t, block16 + 1u + v);
        un.c = uvec4(0u);
        un.e = v / 2u;
    }
    un.e |= is_q6(t) ? 1u << 31 : 0u;
    return un;
}

void decode_run(RUnit un, uint run, out vec4 q[4], out float scale, out float minv) {
    if ((un.e >> 31) == 0u) {
        Unit q4 = Unit(un.a, un.b, un.e);
        decode_run(q4, run, q, scale, minv);
        return;
    }
    uint v = (un.e >> 16) & 7u;
    uint n = v / 4u;
    uint qq = (v / 2u) % 2u + 2u * run;
    uvec4 codes = ((un.a >> (4u * run)) & 0x0f0f0f0fu) | (((un.b >> (2u * qq)) & 0x03030303u) << 4);
    for (uint k = 0u; k < 4u; k++) {
        q[k] = byte_fields(codes[k], 32.0);
    }
    uint s = 8u * n + (v % 2u) + 2u * qq;
    float d = unpackHalf2x16(un.e & 0xFFFFu).x;
    scale = d * sbyte_float((un.c[s / 4u] >> (8u * (s % 4u))) & 0xFFu);
    minv = 0.0;
}

// The first value / 4 of run `run` of unit u of a row.
uint runit_x4(RUnit un, uint u, uint run) {
    if ((un.e >> 31) == 0u) {
        return run_x4(u, run);
    }
    uint v = u % 8u;
    return (256u * (u / 8u) + 128u * (v / 4u) + 32u * ((v / 2u) % 2u + 2u * run) + 16u * (v % 2u)) / 4u;
}

struct Phase {
    uint stage;
    uint rows;
    uint n_in;
};

Phase phase_of(uint g) {
    if (g == QKV) {
        return Phase(g, q_dim() + 2u * kv_dim(), p.n_in);
    } else if (g == ATTN) {
        return Phase(g, n_head(), 0u);
    } else if (g == WO) {
        return Phase(g, p.n_in, q_dim());
    } else if (g == GATE_UP) {
        return Phase(g, 2u * p.n_ff, p.n_in);
    }
    return Phase(g, p.n_in, p.n_ff);
}

// The tensor and its row that row r of matvec phase g reads.
uvec2 tensor_row(uint g, uint r) {
    if (g == QKV) {
        if (r < q_dim()) {
            return uvec2(T_Q, r);
        }
        r -= q_dim();
        return r < kv_dim() ? uvec2(T_K, r) : uvec2(T_V, r - kv_dim());
    } else if (g == WO) {
        return uvec2(T_WO, r);
    } else if (g == GATE_UP) {
        return uvec2(T_GATE + (r & 1u), r >> 1);
    }
    return uvec2(T_DOWN, r);
}

#define BLOCK_UNIT RUnit
#define UNIT_X4(un, unit, run) runit_x4(un, unit, run)
#include "persistent_blocks.glsl"

uint blocks_of(uint g) {
    Phase ph = phase_of(g);
    if (ph.stage == ATTN) {
        return ph.rows;
    }
    Cut c = cut_of(ph.n_in);
    return (ph.rows + c.rb - 1u) / c.rb;
}

void load_block(out RUnit un[MAXU], uint g, uint b) {
    Phase ph = phase_of(g);
    if (ph.stage == ATTN) {
        return;
    }
    Cut c = cut_of(ph.n_in);
    for (uint k = 0u; k < MAXU; k++) {
        uint row;
        uint unit;
        bool valid;
        slot_place(ph, c, b, k, row, unit, valid);
        uvec2 tr = tensor_row(g, row);
        un[k] = load_runit(tr.x, tr.y * row_stride(tr.x, ph.n_in), unit, ph.n_in / 256u);
    }
}

uint first_phase() {
    return p.phase_range & 0xFFFFu;
}
uint end_phase() {
    uint end = p.phase_range >> 16;
    return end == 0u ? 5u : end;
}

void next_item(inout uint g, inout uint b) {
    b += p.groups_x;
    while (g < end_phase() && b >= blocks_of(g)) {
        g += 1u;
        b = gl_WorkGroupID.x;
    }
}

float workgroup_sum(float v) {
    float s = subgroupAdd(v);
    if (subgroupElect()) {
        reduce_parts[gl_SubgroupID] = s;
    }
    barrier();
    float total = 0.0;
    for (uint j = 0u; j < gl_NumSubgroups; j++) {
        total += reduce_parts[j];
    }
    barrier();
    return total;
}

float workgroup_max(float v) {
    float s = subgroupMax(v);
    if (subgroupElect()) {
        reduce_parts[gl_SubgroupID] = s;
    }
    barrier();
    float m = reduce_parts[0];
    for (uint j = 1u; j < gl_NumSubgroups; j++) {
        m = max(m, reduce_parts[j]);
    }
    barrier();
    return m;
}

float silu(float v) {
    return v / (1.0 + exp(-v));
}

// Stages phase g's input into xs (f16 pairs) and its scale into
// stage_scale: q/k/v and gate/up x times the norm weight, the norm's factor
// as the scale; wo and down their inputs as they are.
void stage_input(uint g) {
    Phase ph = phase_of(g);
    bool normed = g == QKV || g == GATE_UP;
    uint norm4 = (g == QKV ? p.attn_norm : p.ffn_norm) / 4u;
    uint src4 = g == WO ? attn_slot() / 4u : act_slot() / 4u;
    float sumsq = 0.0;
    uint quads = ph.n_in / 4u;
    for (uint q0 = gl_LocalInvocationID.x; q0 < quads; q0 += STAGE_LOADS * WG) {
        vec4 v[STAGE_LOADS];
        for (uint k = 0u; k < STAGE_LOADS; k++) {
            uint q = min(q0 + k * WG, quads - 1u);
            v[k] = normed ? x_f4[q] : vec_f4[src4 + q];
        }
        for (uint k = 0u; k < STAGE_LOADS; k++) {
            uint q = q0 + k * WG;
            if (q < quads) {
                vec4 x = v[k];
                if (normed) {
                    sumsq += dot(x, x);
                    x *= params4[norm4 + q];
                }
                xs[2u * q] = packHalf2x16(x.xy);
                xs[2u * q + 1u] = packHalf2x16(x.zw);
            }
        }
    }
    float total = workgroup_sum(sumsq);
    if (gl_LocalInvocationID.x == 0u) {
        stage_scale = normed ? inversesqrt(total / float(ph.n_in) + p.eps) : 1.0;
    }
    barrier();
}

// Sums block b of matvec phase g and stores it.
void sum_block(RUnit un[MAXU], uint g, uint b) {
    Phase ph = phase_of(g);
    Cut c = cut_of(ph.n_in);
    uint tid = gl_LocalInvocationID.x;
    uint row;
    float s;
    if (block_sum(un, ph, b, row, s)) {
        s *= stage_scale;
        if (g == QKV) {
            vec_f[qkv_slot() + row] = s;
        } else if (g == GATE_UP) {
            row_sums[tid] = s;
        } else {
            // wo and down add into the residual stream; each row is read
            // and written by this invocation alone.
            x_f[row] += s;
        }
    }
    barrier();
    // Gate and up rows alternate, and a block holds whole pairs.
    if (g == GATE_UP && tid < c.rb / 2u && b * c.rb + 2u * tid < ph.rows) {
        float gate = row_sums[2u * tid];
        vec_f[act_slot() + b * c.rb / 2u + tid] = silu(gate) * row_sums[2u * tid + 1u];
    }
    barrier();
}

float f16_round(float v) {
    return unpackHalf2x16(packHalf2x16(vec2(v, 0.0))).x;
}

// Elements of RoPE pair i within a head (rope_pair of span_rope.glsl for
// head 0: head_dim rotated values).
uvec2 head_pair(uint i) {
    return rope_pair(i, p.head_dim, p.head_dim, (p.flags & 1u) != 0u);
}

// Attention of query head hq (one workgroup) for the step's token.
void attention_block(uint hq) {
    uint pos = step_words[0];
    uint row0 = step_words[2];
    uint group = n_head() / n_kv();
    uint j = hq / group;
    uint d_head = p.head_dim;
    uint tid = gl_LocalInvocationID.x;
    uint row_words = kv_dim() / 2u;
    uint k_src = qkv_slot() + q_dim() + j * d_head;
    uint v_src = k_src + kv_dim();
    for (uint i = tid; i < d_head / 2u; i += WG) {
        uvec2 e = head_pair(i);
        vec2 cs = rope_angle(p.rope_table, pos, d_head, i);
        vec2 r = rope_rotate(vec_f[k_src + e.x], vec_f[k_src + e.y], cs);
        kc[e.x] = f16_round(r.x);
        kc[e.y] = f16_round(r.y);
    }
    for (uint i = tid; i < d_head; i += WG) {
        vc[i] = f16_round(vec_f[v_src + i]);
    }
    barrier();
    uint head_words = j * d_head / 2u;
    if (hq % group == 0u) {
        uint at = (row0 + pos) * row_words + head_words;
        for (uint i = tid; i < d_head / 2u; i += WG) {
            k_cache[at + i] = packHalf2x16(vec2(kc[2u * i], kc[2u * i + 1u]));
            v_cache[at + i] = packHalf2x16(vec2(vc[2u * i], vc[2u * i + 1u]));
        }
    }
    uint q_src = qkv_slot() + hq * d_head;
    for (uint i = tid; i < d_head / 2u; i += WG) {
        uvec2 e = head_pair(i);
        vec2 cs = rope_angle(p.rope_table, pos, d_head, i);
        vec2 r = rope_rotate(vec_f[q_src + e.x], vec_f[q_src + e.y], cs);
        qr[e.x] = r.x;
        qr[e.y] = r.y;
    }
    barrier();
    // Scores of positions tid, tid + WG, ... into xs (as float bits), a
    // cached key read as 16-byte words four at a time.
    float m = -3.0e38;
    for (uint t = tid; t <= pos; t += WG) {
        float s = 0.0;
        if (t == pos) {
            for (uint d = 0u; d < d_head; d++) {
                s += qr[d] * kc[d];
            }
        } else {
            // A whole number of 16-byte words: head_dim is a multiple of 8.
            uint kw = (row0 + t) * row_words + head_words;
            for (uint c = 0u; c < d_head / 8u; c += 4u) {
                uvec4 k4[4];
                for (uint u = 0u; u < 4u; u++) {
                    k4[u] = k_cache4[kw / 4u + min(c + u, d_head / 8u - 1u)];
                }
                for (uint u = 0u; u < 4u && c + u < d_head / 8u; u++) {
                    uint d0 = 8u * (c + u);
                    for (uint q = 0u; q < 4u; q++) {
                        vec2 k = unpackHalf2x16(k4[u][q]);
                        s += qr[d0 + 2u * q] * k.x + qr[d0 + 2u * q + 1u] * k.y;
                    }
                }
            }
        }
        s *= p.attn_scale;
        xs[t] = floatBitsToUint(s);
        m = max(m, s);
    }
    m = workgroup_max(m);
    float sum = 0.0;
    for (uint t = tid; t <= pos; t += WG) {
        float e = exp(uintBitsToFloat(xs[t]) - m);
        xs[t] = floatBitsToUint(e);
        sum += e;
    }
    sum = workgroup_sum(sum);
    // The weighted values: each thread owns one word (two dimensions) and
    // every sets-th cached position, eight loads issued together; this
    // position's value comes from vc.
    uint words = d_head / 2u;
    uint sets = WG / words;
    uint word = tid % words;
    uint set = tid / words;
    vec2 o = vec2(0.0);
    if (set < sets) {
        uint vw = row0 * row_words + head_words + word;
        for (uint t0 = set; t0 < pos; t0 += 8u * sets) {
            uint v8[8];
            for (uint u = 0u; u < 8u; u++) {
                uint t = min(t0 + u * sets, pos - 1u);
                v8[u] = v_cache[vw + t * row_words];
            }
            for (uint u = 0u; u < 8u && t0 + u * sets < pos; u++) {
                o += uintBitsToFloat(xs[t0 + u * sets]) * unpackHalf2x16(v8[u]);
            }
        }
    }
    out_parts[2u * tid] = o.x;
    out_parts[2u * tid + 1u] = o.y;
    barrier();
    for (uint d = tid; d < d_head; d += WG) {
        float total = uintBitsToFloat(xs[pos]) * vc[d];
        for (uint k = 0u; k < sets; k++) {
            total += out_parts[2u * (k * words + d / 2u) + (d & 1u)];
        }
        vec_f[attn_slot() + hq * d_head + d] = total / sum;
    }
    // xs, qr, kc and vc serve the workgroup's next block.
    barrier();
}

void main() {
    uint first = first_phase();
    uint phases = end_phase();
    uint g = first;
    uint b = gl_WorkGroupID.x;
    if (b >= blocks_of(first)) {
        b -= p.groups_x;
        next_item(g, b);
    }
    RUnit cur[MAXU];
    if (g < phases) {
        load_block(cur, g, b);
    }
    for (uint ph = first; ph < phases; ph++) {
        if (ph > first) {
            wait_for(ph - first);
        }
        bool matvec = ph != ATTN;
        if (g == ph && matvec) {
            stage_input(ph);
        }
        while (g == ph) {
            uint ng = g;
            uint nb = b;
            next_item(ng, nb);
            // The next block's units stream while this one is summed.
            RUnit nxt[MAXU];
            if (ng < phases) {
                load_block(nxt, ng, nb);
            }
            if (matvec) {
                sum_block(cur, g, b);
            } else {
                attention_block(b);
            }
            cur = nxt;
            g = ng;
            b = nb;
        }
        arrive();
    }
}
