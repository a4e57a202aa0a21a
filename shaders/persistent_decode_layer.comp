#version 450
// Measurement kernel (the persistent_decode bench of fish-vk): p.layers
// whole llama decode layers of one token in ONE dispatch of resident
// workgroups, a grid-wide barrier between dependent phases: the form a
// persistent span kernel would take, with the semantics of a span layer so
// that its time per layer compares with a span's decode profile, and its
// outputs with a CPU reference (tests/grid_barrier.rs).
//
// A layer is five phases (g = 5 l + stage), each reading vector slots the
// phases before it wrote (binding 1):
//   0 q/k/v: attention norm of x (slot 0 of the layer) in the staging, then
//     q | k | v (n_embd + 2 n_kv_heads head_dim rows) into slot 1;
//   1 attention: one block per query head: RoPE on its q and its key-value
//     head's k at p.pos (the group's first query head stores k and v as f16
//     at position p.pos of the layer's KV region; the others use their own
//     copy for that position), softmax(q k / sqrt(head_dim)) over positions
//     0..p.pos, the weighted values into slot 2;
//   2 wo: slot 1 of the layer (x) plus wo times slot 2, into slot 3;
//   3 gate/up: feed-forward norm of slot 3 in the staging, gate and up rows
//     alternating (2 n_ff rows), SiLU(gate) * up of each pair into slot 4
//     (n_ff values);
//   4 down: slot 3 plus down times slot 4, into slot 0 of the next layer.
// Every slot is written once per dispatch (fresh addresses, so the inputs
// could come through L1; here they are read coherently).
//
// The weights are Q4_K (one type keeps the probe short: a span kernel for
// the Q4_K_M mix needs Q6_K beside it). Layer l uses copy l % p.copies: the
// q/k/v, wo, gate/up and down matrices one after another, then the two
// norms' n_embd f32 weights. A matvec phase's rows are cut into blocks
// dealt to the workgroups in turn (as in persistent_layer_probe.comp); a
// workgroup stages the phase's input into shared memory as f16 pairs once,
// and loads its next block's units before it sums the current one, across
// phases too (the first weights of the next phase stream while it waits).
// The staged inputs are rounded to f16 (shared memory holds 14336 of them
// in 28 KB), and so are the keys and values, as in the span's KV cache.
//
// A wait that outlasts SPIN_LIMIT polls gives up and raises the failure
// word (word 1 of binding 1): the results are then wrong, and the host
// says so.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_memory_scope_semantics : require

#define TYPE_Q4_K
layout(local_size_x = 128) in;
const uint WG = 128u;
// Units per invocation and block.
const uint MAXU = 4u;
// The longest staged input (llama-8b's n_ff); the scores of at most
// MAX_IN / 2 positions share its shared memory.
const uint MAX_IN = 14336u;
// The widest head.
const uint MAX_D = 128u;

// The layer shape and the step (persistent_layer.rs `DecodeRun`); n_in is
// n_embd, named so for dequant.glsl's macros.
layout(push_constant) uniform Layer {
    uint n_in;
    uint n_ff;
    uint layers;
    uint copies;
    uint slot_stride;
    uint pos;
    uint groups_x;
    // n_head | n_kv_heads << 16.
    uint heads;
    uint head_dim;
    float eps;
    // Positions per layer in the KV region.
    uint kv_capacity;
    float rope_base;
    // Bit 0: NeoX RoPE halves (i, i + head_dim / 2), else adjacent pairs.
    uint flags;
    // First word of the vector slots (after the KV regions, on a 256-byte
    // boundary, as is every slot: no cache line holds two slots).
    uint slots0;
    // The phases this dispatch runs: first | end << 16 (0: all of them). A
    // step recorded as one dispatch per phase, with pipeline barriers
    // between them, runs the same code without grid-wide barriers.
    uint phase_range;
} p;

layout(std430, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, binding = 0) readonly buffer Weights4 { uvec4 w4[]; };
#include "dequant.glsl"
#include "matvec_units.glsl"

layout(std430, binding = 1) coherent buffer Vecs { float vec_f[]; };
layout(std430, binding = 1) coherent buffer VecsU { uint vec_u[]; };
// What the kernel reads of binding 1 (inputs, residuals, cached keys and
// values) it never reads before it is written, nor after it is rewritten,
// and no cache line holds both a slot and a word written later: with
// L1_INPUTS those reads take the ordinary, L1-cached loads; without, the
// coherent ones.
// Loads of the staging a thread issues together.
const uint STAGE_LOADS = 8u;
#if defined(L1_INPUTS)
layout(std430, binding = 1) readonly buffer VecsR4 { vec4 vec_rf4[]; };
layout(std430, binding = 1) readonly buffer VecsR { float vec_rf[]; };
layout(std430, binding = 1) readonly buffer VecsRU { uint vec_ru[]; };
layout(std430, binding = 1) readonly buffer VecsRU4 { uvec4 vec_ru4[]; };
#define IN_F(i) vec_rf[i]
#define IN_F4(i) vec_rf4[i]
#define IN_U(i) vec_ru[i]
#define IN_U4(i) vec_ru4[i]
#else
layout(std430, binding = 1) coherent buffer VecsF4 { vec4 vec_f4[]; };
layout(std430, binding = 1) coherent buffer VecsU4 { uvec4 vec_u4[]; };
#define IN_F(i) vec_f[i]
#define IN_F4(i) vec_f4[i]
#define IN_U(i) vec_u[i]
#define IN_U4(i) vec_u4[i]
#endif
layout(std430, binding = 1) volatile buffer Arrivals { uint arrivals[]; };

// Words before the KV region: the arrival counter (word 0), the failure
// word (1), padding.
const uint HEADER_WORDS = 64u;
const uint SPIN_LIMIT = 1u << 22;

const uint QKV = 0u;
const uint ATTN = 1u;
const uint WO = 2u;
const uint GATE_UP = 3u;
const uint DOWN = 4u;

shared uint xs[MAX_IN / 2u];
shared float partial[WG * MAXU / 4u];
// A gate/up block's row sums (rows per block: at most WG / 32 * MAXU for
// rows of 1024 values or more).
shared float row_sums[WG * MAXU / 32u];
shared float reduce_parts[WG];
shared float kc[MAX_D];
shared float vc[MAX_D];
shared float qr[MAX_D];
// The weighted values' partial sums: two per thread.
shared float out_parts[2u * WG];
// The staged input's scale (the norm's factor, or 1).
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
uint qkv_rows() {
    return p.n_in + 2u * kv_dim();
}
uint row_bytes(uint n) {
    return n / 256u * BLOCK_BYTES;
}

// First word of slot k of layer l, and of the layer's keys / values.
uint slot_word(uint l, uint k) {
    return p.slots0 + (5u * l + k) * p.slot_stride;
}
uint key_word(uint l, uint pos) {
    return HEADER_WORDS + l * p.kv_capacity * kv_dim() + pos * kv_dim() / 2u;
}
uint value_word(uint l, uint pos) {
    return key_word(l, pos) + p.kv_capacity * kv_dim() / 2u;
}

// Byte offsets within one layer copy.
uint wo_byte() {
    return qkv_rows() * row_bytes(p.n_in);
}
uint gate_up_byte() {
    return wo_byte() + p.n_in * row_bytes(p.n_in);
}
uint down_byte() {
    return gate_up_byte() + 2u * p.n_ff * row_bytes(p.n_in);
}
uint norms_byte() {
    return down_byte() + p.n_in * row_bytes(p.n_ff);
}
uint copy_base(uint l) {
    return (l % p.copies) * (norms_byte() + 8u * p.n_in);
}

struct Phase {
    uint stage;
    uint rows;
    uint n_in;
    uint byte0;
};

Phase phase_of(uint g) {
    uint stage = g % 5u;
    uint base = copy_base(g / 5u);
    if (stage == QKV) {
        return Phase(stage, qkv_rows(), p.n_in, base);
    } else if (stage == ATTN) {
        return Phase(stage, n_head(), 0u, 0u);
    } else if (stage == WO) {
        return Phase(stage, p.n_in, n_head() * p.head_dim, base + wo_byte());
    } else if (stage == GATE_UP) {
        return Phase(stage, 2u * p.n_ff, p.n_in, base + gate_up_byte());
    }
    return Phase(stage, p.n_in, p.n_ff, base + down_byte());
}

#include "persistent_blocks.glsl"

uint blocks_of(uint g) {
    Phase ph = phase_of(g);
    if (ph.stage == ATTN) {
        return ph.rows;
    }
    Cut c = cut_of(ph.n_in);
    return (ph.rows + c.rb - 1u) / c.rb;
}

void load_block(out Unit un[MAXU], uint g, uint b) {
    Phase ph = phase_of(g);
    if (ph.stage == ATTN) {
        return;
    }
    Cut c = cut_of(ph.n_in);
    uint rb = row_bytes(ph.n_in);
    for (uint k = 0u; k < MAXU; k++) {
        uint row;
        uint unit;
        bool valid;
        slot_place(ph, c, b, k, row, unit, valid);
        un[k] = load_unit(ph.byte0 + row * rb, unit);
    }
}

// The phases this dispatch runs: [first_phase(), end_phase()).
uint first_phase() {
    return p.phase_range & 0xFFFFu;
}
uint end_phase() {
    uint end = p.phase_range >> 16;
    return end == 0u ? 5u * p.layers : end;
}

void next_item(inout uint g, inout uint b) {
    b += p.groups_x;
    while (g < end_phase() && b >= blocks_of(g)) {
        g += 1u;
        b = gl_WorkGroupID.x;
    }
}

// The sum of every invocation's v (all invocations call it).
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
// stage_scale: q/k/v and gate/up the normed x (x * norm weight, the norm's
// factor as the scale), wo the attention output, down the gate/up phase's
// SiLU(gate) * up.
void stage_input(uint g) {
    Phase ph = phase_of(g);
    uint l = g / 5u;
    uint src;
    uint norm_word = 0u;
    if (ph.stage == QKV) {
        src = slot_word(l, 0u);
        norm_word = (copy_base(l) + norms_byte()) / 4u;
    } else if (ph.stage == WO) {
        src = slot_word(l, 2u);
    } else if (ph.stage == GATE_UP) {
        src = slot_word(l, 3u);
        norm_word = (copy_base(l) + norms_byte()) / 4u + p.n_in;
    } else {
        src = slot_word(l, 4u);
    }
    bool normed = ph.stage == QKV || ph.stage == GATE_UP;
    float sumsq = 0.0;
    // Four values per 16-byte load, STAGE_LOADS loads of a thread issued
    // together (a loop of one load at a time would wait a latency each).
    uint quads = ph.n_in / 4u;
    for (uint q0 = gl_LocalInvocationID.x; q0 < quads; q0 += STAGE_LOADS * WG) {
        vec4 v[STAGE_LOADS];
        for (uint k = 0u; k < STAGE_LOADS; k++) {
            v[k] = IN_F4(src / 4u + min(q0 + k * WG, quads - 1u));
        }
        for (uint k = 0u; k < STAGE_LOADS; k++) {
            uint q = q0 + k * WG;
            if (q < quads) {
                vec4 x = v[k];
                if (normed) {
                    sumsq += dot(x, x);
                    x *= uintBitsToFloat(w4[norm_word / 4u + q]);
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

// Sums block b of matvec phase g and stores it: scaled by the staging's
// scale, plus the residual for wo and down.
void sum_block(Unit un[MAXU], uint g, uint b) {
    Phase ph = phase_of(g);
    Cut c = cut_of(ph.n_in);
    uint l = g / 5u;
    uint tid = gl_LocalInvocationID.x;
    uint row;
    float s;
    if (block_sum(un, ph, b, row, s)) {
        s *= stage_scale;
        if (ph.stage == QKV) {
            vec_f[slot_word(l, 1u) + row] = s;
        } else if (ph.stage == WO) {
            vec_f[slot_word(l, 3u) + row] = s + IN_F(slot_word(l, 0u) + row);
        } else if (ph.stage == GATE_UP) {
            row_sums[tid] = s;
        } else {
            vec_f[slot_word(l + 1u, 0u) + row] = s + IN_F(slot_word(l, 3u) + row);
        }
    }
    barrier();
    // Gate and up rows alternate, and a block holds whole pairs (an even
    // number of rows): SiLU(gate) * up of each pair, once, for down.
    if (ph.stage == GATE_UP && tid < c.rb / 2u && b * c.rb + 2u * tid < ph.rows) {
        float gate = row_sums[2u * tid];
        vec_f[slot_word(l, 4u) + b * c.rb / 2u + tid] = silu(gate) * row_sums[2u * tid + 1u];
    }
    barrier();
}

float f16_round(float v) {
    return unpackHalf2x16(packHalf2x16(vec2(v, 0.0))).x;
}

// The elements of RoPE pair i within a head, and its (cos, sin) at p.pos.
uvec2 rope_pair(uint i) {
    if ((p.flags & 1u) != 0u) {
        return uvec2(i, i + p.head_dim / 2u);
    }
    return uvec2(2u * i, 2u * i + 1u);
}
vec2 rope_cs(uint i) {
    float theta = float(p.pos) * pow(p.rope_base, -2.0 * float(i) / float(p.head_dim));
    return vec2(cos(theta), sin(theta));
}
vec2 rotate(vec2 v, vec2 cs) {
    return vec2(v.x * cs.x - v.y * cs.y, v.x * cs.y + v.y * cs.x);
}

// Attention of query head hq in phase g (one workgroup) over positions
// 0..p.pos into slot 2; the first query head of each key-value head also
// stores that head's key and value at p.pos.
void attention_block(uint g, uint hq) {
    uint l = g / 5u;
    uint group = n_head() / n_kv();
    uint j = hq / group;
    uint d_head = p.head_dim;
    uint tid = gl_LocalInvocationID.x;
    uint qkv = slot_word(l, 1u);
    uint k_src = qkv + p.n_in + j * d_head;
    uint v_src = k_src + kv_dim();
    // This position's key, rotated, and value, both as the cache holds them.
    for (uint i = tid; i < d_head / 2u; i += WG) {
        uvec2 e = rope_pair(i);
        vec2 r = rotate(vec2(IN_F(k_src + e.x), IN_F(k_src + e.y)), rope_cs(i));
        kc[e.x] = f16_round(r.x);
        kc[e.y] = f16_round(r.y);
    }
    for (uint i = tid; i < d_head; i += WG) {
        vc[i] = f16_round(IN_F(v_src + i));
    }
    barrier();
    uint head_words = j * d_head / 2u;
    if (hq % group == 0u) {
        for (uint i = tid; i < d_head / 2u; i += WG) {
            vec_u[key_word(l, p.pos) + head_words + i] = packHalf2x16(vec2(kc[2u * i], kc[2u * i + 1u]));
            vec_u[value_word(l, p.pos) + head_words + i] = packHalf2x16(vec2(vc[2u * i], vc[2u * i + 1u]));
        }
    }
    float inv_sqrt = inversesqrt(float(d_head));
    {
        uint q_src = qkv + hq * d_head;
        for (uint i = tid; i < d_head / 2u; i += WG) {
            uvec2 e = rope_pair(i);
            vec2 r = rotate(vec2(IN_F(q_src + e.x), IN_F(q_src + e.y)), rope_cs(i));
            qr[e.x] = r.x;
            qr[e.y] = r.y;
        }
        barrier();
        // Scores of positions tid, tid + WG, ... into xs (as float bits).
        // A cached key is read as 16-byte words, four issued together, so
        // that a thread has several loads in flight (a loop of dependent
        // loads would wait one memory latency per word).
        float m = -3.0e38;
        for (uint t = tid; t <= p.pos; t += WG) {
            float s = 0.0;
            if (t == p.pos) {
                for (uint d = 0u; d < d_head; d++) {
                    s += qr[d] * kc[d];
                }
            } else {
                uint kw4 = (key_word(l, t) + head_words) / 4u;
                for (uint c = 0u; c < d_head / 8u; c += 4u) {
                    uvec4 k4[4];
                    for (uint u = 0u; u < 4u; u++) {
                        k4[u] = IN_U4(kw4 + min(c + u, d_head / 8u - 1u));
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
            s *= inv_sqrt;
            xs[t] = floatBitsToUint(s);
            m = max(m, s);
        }
        m = workgroup_max(m);
        float sum = 0.0;
        for (uint t = tid; t <= p.pos; t += WG) {
            float e = exp(uintBitsToFloat(xs[t]) - m);
            xs[t] = floatBitsToUint(e);
            sum += e;
        }
        // Its barriers also make every weight in xs visible.
        sum = workgroup_sum(sum);
        // The weighted values: each thread owns one word (two dimensions)
        // and every sets-th cached position, eight loads issued together;
        // the sets' sums meet in shared memory, and this position's value
        // (not yet readable from the cache by other workgroups) is added
        // from vc.
        uint words = d_head / 2u;
        uint sets = WG / words;
        uint word = tid % words;
        uint set = tid / words;
        vec2 o = vec2(0.0);
        if (set < sets) {
            uint vw = value_word(l, 0u) + head_words + word;
            uint row_words = kv_dim() / 2u;
            for (uint t0 = set; t0 < p.pos; t0 += 8u * sets) {
                uint v8[8];
                for (uint u = 0u; u < 8u; u++) {
                    uint t = min(t0 + u * sets, p.pos - 1u);
                    v8[u] = IN_U(vw + t * row_words);
                }
                for (uint u = 0u; u < 8u && t0 + u * sets < p.pos; u++) {
                    o += uintBitsToFloat(xs[t0 + u * sets]) * unpackHalf2x16(v8[u]);
                }
            }
        }
        out_parts[2u * tid] = o.x;
        out_parts[2u * tid + 1u] = o.y;
        barrier();
        for (uint d = tid; d < d_head; d += WG) {
            float total = uintBitsToFloat(xs[p.pos]) * vc[d];
            for (uint k = 0u; k < sets; k++) {
                total += out_parts[2u * (k * words + d / 2u) + (d & 1u)];
            }
            vec_f[slot_word(l, 2u) + hq * d_head + d] = total / sum;
        }
        // xs, qr, kc and vc serve the workgroup's next block.
        barrier();
    }
}

void main() {
    uint first = first_phase();
    uint phases = end_phase();
    // This workgroup's first item.
    uint g = first;
    uint b = gl_WorkGroupID.x;
    if (b >= blocks_of(first)) {
        b -= p.groups_x;
        next_item(g, b);
    }
    Unit cur[MAXU];
    if (g < phases) {
        load_block(cur, g, b);
    }
    for (uint ph = first; ph < phases; ph++) {
        if (ph > first) {
            wait_for(ph - first);
        }
        bool matvec = ph % 5u != ATTN;
        if (g == ph && matvec) {
            stage_input(ph);
        }
        while (g == ph) {
            uint ng = g;
            uint nb = b;
            next_item(ng, nb);
            // The next block's units stream while this one is summed.
            Unit nxt[MAXU];
            if (ng < phases) {
                load_block(nxt, ng, nb);
            }
            if (matvec) {
                sum_block(cur, g, b);
            } else {
                attention_block(g, b);
            }
            cur = nxt;
            g = ng;
            b = nb;
        }
        arrive();
    }
}
