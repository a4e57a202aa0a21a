#version 450
// Span layers of a single-token decode step in ONE dispatch of resident
// workgroups (span/persistent.rs, FISH_GPU_PERSISTENT): the dependent
// stages of a llama layer separated by grid-wide waits instead of dispatch
// boundaries, on int8 activations as the staged decode's matvecs take them
// (matvec_i8.comp). A dispatch runs one layer, or consecutive layers
// (FISH_GPU_PERSISTENT_SPAN=1), each after a grid-wide wait for the
// layer before it. Phases of a layer:
//   0 q/k/v: each workgroup with rows to sum quantises the attention norm
//     of x into shared memory (the blocks of int8_acts.glsl), then k and v,
//     then q, into the scratch, each value tagged with its layer;
//   1 attention, with no grid-wide wait before it (it polls the tags of
//     the values it reads, so each head starts once its own rows are
//     stored): each query head's positions up to the token's in runs of
//     consecutive positions, one workgroup per run: RoPE from the span's
//     cos/sin table on its q and its key-value head's k (the group's first
//     query head's last run stores k and v as f16 at the token's KV row),
//     softmax(q k * attn_scale) over the run; the last run of a head to
//     finish merges the runs and quantises the weighted values into wo's
//     int8 input (attention_run);
//   2 wo: x += wo times that;
//   3 gate/up: the feed-forward norm of x in shared memory as in phase 0,
//     SiLU(gate) * up of each row into the scratch, each value tagged;
//   4 with no grid-wide wait before it: each block of 32 of those values
//     quantised into down's int8 input by the subgroup that summed its
//     last row, once all of its values carry this layer's tag (see
//     settle_block);
//   5 down: x += down times that.
//
// A matvec phase is a list of tasks dealt to the subgroups in turn (a row;
// for gate/up row i of gate and row i of up), each summed by its subgroup
// alone in rounds of two units per lane, with no workgroup barrier, as the
// staged kernel's one-subgroup workgroups sum their rows. Right after a
// subgroup arrives at the end of a matvec phase it loads the first round
// of its first task in the next matvec phase, so that those weights stream
// during the wait (and, for wo, during the attention; for down, during
// the settling).
//
// Each matrix is Q4_K or Q6_K (the Q4_K_M mix; p.types says which are
// Q6_K), in its own buffer, read through the array at binding 6. Both
// types are read as units of 32 values in two runs of 16 that share a
// scale, so a phase's tasks are cut alike whatever their rows' types; each
// task's rounds run in a loop compiled for its type.
//
// wo's and down's int8 inputs are written in this dispatch at addresses
// that no earlier phase of it reads, so they are read through the L1
// cache; x (rewritten in place by wo and down) is read coherently, and the
// tagged values through volatile loads. Every phase arrives at the layer's
// counter, those without a wait before them too, so that g arrivals per
// workgroup precede phase g. Scores of at most MAX_EMBD / 4 positions share the
// staging's shared memory (the host keeps the dispatch to those). A wait that
// outlasts SPIN_LIMIT polls gives up and raises the failure word (scratch
// word 0); the host then discards the forward.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_spirv_intrinsics : require
#extension GL_EXT_control_flow_attributes : enable

#define TYPE_Q4_K
// Blocks quantised within subgroups (int8_acts.glsl quantise_part).
#define QUANT_IN_SUBGROUP 1
#define INT8_PARTS_WRITER 1
layout(local_size_x = 128) in;
const uint WG = 128u;
const uint MAX_EMBD = 8192u;
const uint MAX_D = 128u;

// Layers of one dispatch: at most the set's slots (SET_SLOTS, from the
// storage buffers the device binds), at most MAX_LAYERS (p.types' bytes).
const uint MAX_LAYERS = 32u;
layout(constant_id = 0) const uint SET_SLOTS = 1u;

// span/persistent.rs `push_words`; n_in is n_embd, named so for
// dequant.glsl. Every layer of a dispatch shares the shape, n_ff and the
// RoPE table, and its norms lie norm_stride floats after the layer
// before's (the host checks it).
layout(push_constant) uniform Layers {
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
    // Float offsets in the parameters of the first layer's two norms, the
    // floats from a layer's norms to the next's, and the RoPE table.
    uint attn_norm;
    uint ffn_norm;
    uint norm_stride;
    uint rope_table;
    // Scratch word of the span's first layer's first slot, and the words
    // from a layer's slots to the next's.
    uint slots0;
    uint slot_stride;
    // Scratch word of the activation's tagged values (see settle_block),
    // zeroed before every forward.
    uint act_tags;
    // Scratch word of q | k | v with their layer's tags (two words a value),
    // zeroed before every forward.
    uint qkv_tags;
    // Scratch word of the attention's arrival counters, one per query head
    // 16 words apart, zeroed before every forward (each head's merge puts
    // its counter back to zero), and of the runs' partial results
    // (attention_run).
    uint attn_counts;
    uint attn_parts;
    // The phases this dispatch runs: first | end << 16 (0: all six). A
    // layer recorded as one dispatch per phase, with pipeline barriers
    // between them, runs the same code without grid-wide waits (one layer).
    uint phase_range;
    // The layers it runs, by their index in the span: first | count << 16.
    uint layers;
    // The span index of the layer in slot 0 of the set's arrays.
    uint slot_base;
    // Bit t of byte i: tensor t (q, k, v, wo, gate, up, down) of the
    // dispatch's layer i is Q6_K, else Q4_K.
    uint types[MAX_LAYERS / 4u];
} p;

// dequant.glsl and matvec_units.glsl (Q4_K) name binding 0 as `w` and
// `w4`; this kernel never reads them (the optimiser drops both), so they
// alias x's binding.
layout(std430, binding = 0) readonly buffer Wq { uint w[]; };
layout(std430, binding = 0) readonly buffer Wq4 { uvec4 w4[]; };
// The seven matrices of each layer of the set (slot l: 7 l .. 7 l + 6) as
// one array of buffers, read with an index uniform in every workgroup (a
// workgroup's subgroups take consecutive tasks, and every tensor's rows
// are a multiple of the subgroups per workgroup): one load per 16 bytes,
// where choosing among single bindings by a switch cost the matvec phases
// ~30%.
layout(std430, binding = 6) readonly buffer Matrix4 { uvec4 v[]; } mats[7u * SET_SLOTS];
#include "dequant.glsl"
#include "matvec_units.glsl"
#include "int8_dot.glsl"
#include "gated_act.glsl"

// The residual stream (token 0), read and written across workgroups.
layout(std430, binding = 0) coherent buffer X { float x_f[]; };
layout(std430, binding = 0) coherent buffer X4 { vec4 x_f4[]; };
// Each layer's f16 keys and values, two per word, one row per position
// (slot l of each array: the layer of slot l).
layout(std430, binding = 1) buffer Keys { uint k_cache[]; } keys[SET_SLOTS];
layout(std430, binding = 1) buffer Keys4 { uvec4 k_cache4[]; } keys4[SET_SLOTS];
layout(std430, binding = 2) buffer Values { uint v_cache[]; } values[SET_SLOTS];
layout(std430, binding = 3) readonly buffer Params { float params[]; };
layout(std430, binding = 3) readonly buffer Params4 { vec4 params4[]; };
// The scratch: the failure word, the arrival counters, the slots.
layout(std430, binding = 4) coherent buffer Scratch { float vec_f[]; };
layout(std430, binding = 4) coherent buffer Scratch4 { vec4 vec_f4[]; };
layout(std430, binding = 4) coherent buffer ScratchWords { uint q8[]; };
// Its int8 writers write q8.
#include "int8_acts.glsl"
layout(std430, binding = 4) volatile buffer Arrivals { uint arrivals[]; };
// Values stored with their layer's tag (value bits, tag): q | k | v and
// SiLU(gate) * up; polled through the volatile views, whose loads the
// compiler may not hoist out of the polling loops.
layout(std430, binding = 4) coherent buffer Tagged { uvec2 tagged[]; };
layout(std430, binding = 4) volatile buffer TaggedPoll { uvec2 tagged_poll[]; };
layout(std430, binding = 4) volatile buffer TaggedPoll4 { uvec4 tagged_poll4[]; };
// The int8 slots again, read through L1 (see above).
layout(std430, binding = 4) readonly buffer Int8In4 { uvec4 in8_4[]; };
layout(std430, binding = 4) readonly buffer Int8InF { float in8_f[]; };
layout(std430, binding = 5) readonly buffer Step { uint step_words[]; };
#include "span_rope.glsl"

// The layer running now, by its index in the span: the counter, tags,
// matrices, caches, norms and types below are its own.
uint cur_layer;
uint first_layer() {
    return p.layers & 0xFFFFu;
}
uint end_layer() {
    return first_layer() + (p.layers >> 16);
}
// Its slot in the set's arrays.
uint layer_slot() {
    return cur_layer - p.slot_base;
}
// Scratch word of layer il's arrival counter, one line per layer after the
// failure word's (persistent.rs `Header`).
uint counter_word_of(uint il) {
    return 64u * (1u + il);
}
#define COUNTER_WORD counter_word_of(cur_layer)
#define FAILURE_WORD 0u
const uint SPIN_LIMIT = 1u << 22;
#include "grid_wait.glsl"

const uint QKV = 0u;
const uint ATTN = 1u;
const uint WO = 2u;
const uint GATE_UP = 3u;
const uint SETTLE = 4u;
const uint DOWN = 5u;
const uint PHASES = 6u;
// No phase (after down).
const uint NONE = 0xFFFFu;

// Tensors, in binding order.
const uint T_Q = 0u;
const uint T_K = 1u;
const uint T_V = 2u;
const uint T_WO = 3u;
const uint T_GATE = 4u;
const uint T_DOWN = 6u;

// The normed input of q/k/v and gate/up in the int8_acts.glsl layout
// (quants, the scale of each 32 values, d * sum of each 16). Its words
// also hold the attention's scores (SCORE): MAX_EMBD / 4 positions.
shared uvec4 sxq[MAX_EMBD / 16u];
shared float sxd[MAX_EMBD / 32u];
shared float sxs[MAX_EMBD / 16u];
#define SCORE(t) sxq[(t) >> 2][(t) & 3u]
shared float reduce_parts[WG];
shared float kc[MAX_D];
shared float vc[MAX_D];
shared float qr[MAX_D];
shared float head_out[MAX_D];
shared float out_parts[2u * WG];

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

// Scratch slots, each on a 256-byte boundary: wo's int8 input, down's int8
// input (persistent.rs sizes them alike), a pair per layer: a layer of a
// dispatch after the first reads its slots through L1, which may still
// hold lines of the layer before's if they shared the addresses.
uint line(uint words) {
    return (words + 63u) / 64u * 64u;
}
uint int8_words(uint n) {
    return 4u * int8_token_vec4s(n);
}
uint attn_slot() {
    return p.slots0 + cur_layer * p.slot_stride;
}
uint act8_slot() {
    return attn_slot() + line(int8_words(q_dim()));
}

// The running layer's byte of p.types (its tensors' Q6_K bits), read once
// per layer rather than at every use.
uint cur_types;
bool is_q6(uint t) {
    return ((cur_types >> t) & 1u) != 0u;
}
void set_layer(uint il) {
    cur_layer = il;
    uint i = il - first_layer();
    cur_types = p.types[i / 4u] >> (8u * (i % 4u));
}

// Bytes of a row of n values of tensor t in the device layout (rows start
// on 16-byte boundaries; a Q6_K row is its 208-byte bodies, then the f16 ds).
uint row_stride(uint t, uint n) {
    uint nb = n / 256u;
    return is_q6(t) ? (210u * nb + 15u) / 16u * 16u : 144u * nb;
}

// 16 bytes of tensor t.
uvec4 wload4(uint t, uint i) {
    return mats[7u * layer_slot() + t].v[i];
}

// A unit of 32 values of either type, two runs of 16 sharing a scale.
// Q4_K (unit v = u % 8 of super-block u / 8): a the block head, b qs bytes
// 16v .. 16v + 15, e the chunk v / 2; run 0 the low nibbles, run 1 the high
// ones (matvec_units.glsl's Q4_K unit). Q6_K: half n = v / 4, quarters qq
// and qq + 2 with qq = (v / 2) % 2, l from 16 (v % 2): a the ql bytes
// 64n + 32qq + 16 (v % 2) .., b the qh bytes 32n + 16 (v % 2) .., c the
// int8 scales of the two runs (bytes 0 and 1), e the f16 d (bits 0..15)
// and v (16..18); run r is quarter qq + 2r, the low (r = 0) or high
// nibbles of a. The type is the caller's to know.
struct RUnit {
    uvec4 a;
    uvec4 b;
    uint c;
    uint e;
};

// q6: the tensor's type (a constant where the caller is specialised).
RUnit load_runit(bool q6, uint t, uint row_byte, uint u, uint nb) {
    RUnit un;
    uint sb = u / 8u;
    uint v = u % 8u;
    if (q6) {
        uint body16 = (row_byte + 208u * sb) / 16u;
        uint n = v / 4u;
        uint qq = (v / 2u) % 2u;
        uint hl = v % 2u;
        un.a = wload4(t, body16 + 4u * n + 2u * qq + hl);
        un.b = wload4(t, body16 + 8u + 2u * n + hl);
        // Scales s0 = 8n + hl + 2qq (run 0) and s0 + 4 (run 1).
        uint s0 = 8u * n + hl + 2u * qq;
        // The ds follow the bodies on a 16-byte boundary.
        uint d_word = (row_byte + 208u * nb) / 4u + sb / 2u;
        uvec4 scales = wload4(t, body16 + 12u);
        uint sc_lo = scales[s0 / 4u];
        uint sc_hi = scales[s0 / 4u + 1u];
        uint dw = wload4(t, d_word / 4u)[d_word % 4u];
        un.c = ((sc_lo >> (8u * (s0 % 4u))) & 0xFFu) | (((sc_hi >> (8u * (s0 % 4u))) & 0xFFu) << 8);
        un.e = ((dw >> (16u * (sb % 2u))) & 0xFFFFu) | (v << 16);
    } else {
        uint block16 = (row_byte + 144u * sb) / 16u;
        un.a = wload4(t, block16);
        un.b = wload4(t, block16 + 1u + v);
        un.c = 0u;
        un.e = v / 2u;
    }
    return un;
}

// The first value / 4 of run `run` of unit u of a row.
uint runit_x4(bool q6, uint u, uint run) {
    if (!q6) {
        return run_x4(u, run);
    }
    uint v = u % 8u;
    return (256u * (u / 8u) + 128u * (v / 4u) + 32u * ((v / 2u) % 2u + 2u * run) + 16u * (v % 2u)) / 4u;
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

uint first_phase() {
    return p.phase_range & 0xFFFFu;
}
uint end_phase() {
    uint end = p.phase_range >> 16;
    return end == 0u ? PHASES : end;
}

// Unit `un`'s run `run` as unsigned codes, its scale, and the offset that
// turns codes into values (matvec_i8.comp's minv - scale * CODE_OFFSET).
void runit_codes(bool q6, RUnit un, uint run, out uvec4 codes, out float scale, out float offset) {
    if (!q6) {
        float minv;
        decode_codes(Unit(un.a, un.b, un.e), run, codes, scale, minv);
        offset = minv;
        return;
    }
    uint v = (un.e >> 16) & 7u;
    uint qq = (v / 2u) % 2u + 2u * run;
    codes = ((un.a >> (4u * run)) & 0x0f0f0f0fu) | (((un.b >> (2u * qq)) & 0x03030303u) << 4);
    float d = unpackHalf2x16(un.e & 0xFFFFu).x;
    scale = d * sbyte_float((un.c >> (8u * run)) & 0xFFu);
    offset = -32.0 * scale;
}

// Values per row of matvec phase g's inputs, and its tasks.
uint n_in_of(uint g) {
    if (g == WO) {
        return q_dim();
    }
    return g == DOWN ? p.n_ff : p.n_in;
}
uint tasks_of(uint g) {
    if (g == QKV) {
        return q_dim() + 2u * kv_dim();
    }
    return g == GATE_UP ? p.n_ff : p.n_in;
}

// The tensor and row of row k of task t of matvec phase g (gate/up: k 0
// the gate row, 1 the up row).
uvec2 task_row(uint g, uint t, uint k) {
    if (g == QKV) {
        // k and v first: every head needs them, while each head needs only
        // its own rows of q (see attention_block).
        if (t < 2u * kv_dim()) {
            return t < kv_dim() ? uvec2(T_K, t) : uvec2(T_V, t - kv_dim());
        }
        return uvec2(T_Q, t - 2u * kv_dim());
    } else if (g == WO) {
        return uvec2(T_WO, t);
    } else if (g == GATE_UP) {
        return uvec2(T_GATE + k, t);
    }
    return uvec2(T_DOWN, t);
}

// A round loads ROUND_UNITS units per lane: half of them of each row of a
// gate/up task, or all of a lone row. Units per lane and row, and rounds
// per task. (4 took 126 registers, so 528 workgroups on the H100, and was
// slower on llama-8b: docs/BENCHMARKS.md.)
#ifndef ROUND_UNITS
#define ROUND_UNITS 2u
#endif
uint lane_units(uint g) {
    return n_in_of(g) / UNIT_VALUES / gl_SubgroupSize;
}
uint rounds_of(uint g) {
    uint per_row = g == GATE_UP ? ROUND_UNITS / 2u : ROUND_UNITS;
    return (lane_units(g) + per_row - 1u) / per_row;
}

// Slot k of round r: the task's row and the lane's unit j of that row
// (valid when j < lane_units).
void round_place(uint g, uint r, uint k, out uint row_k, out uint j) {
    row_k = g == GATE_UP ? k % 2u : 0u;
    j = g == GATE_UP ? r * (ROUND_UNITS / 2u) + k / 2u : ROUND_UNITS * r + k;
}

// A task's tensors and the bytes where its rows start (b: the up row of a
// gate/up task, else a's).
struct Task {
    uint ta;
    uint tb;
    uint byte_a;
    uint byte_b;
};
Task task_of(uint g, uint t) {
    uint n = n_in_of(g);
    uvec2 a = task_row(g, t, 0u);
    uvec2 b = task_row(g, t, 1u);
    return Task(a.x, b.x, a.y * row_stride(a.x, n), b.y * row_stride(b.x, n));
}

// The subgroup's units of round r of task tk, whose rows are of type q6.
void load_round(bool q6, out RUnit un[ROUND_UNITS], uint g, Task tk, uint r) {
    uint nb = n_in_of(g) / 256u;
    uint last = lane_units(g) - 1u;
    for (uint k = 0u; k < ROUND_UNITS; k++) {
        uint row_k;
        uint j;
        round_place(g, r, k, row_k, j);
        uint u = gl_SubgroupInvocationID + gl_SubgroupSize * min(j, last);
        if (row_k == 0u) {
            un[k] = load_runit(q6, tk.ta, tk.byte_a, u, nb);
        } else {
            un[k] = load_runit(q6, tk.tb, tk.byte_b, u, nb);
        }
    }
}
// The first round of the subgroup's next matvec task, loaded ahead.
RUnit ahead[ROUND_UNITS];

// Where a matvec phase's int8 input is, worked out once per phase: in the
// staging (q/k/v, gate/up), or at scratch words q4 * 4 (quants), d_at
// (scales) and s_at (sums).
struct XSrc {
    bool staged;
    uint q4;
    uint d_at;
    uint s_at;
};
XSrc x_src(uint g) {
    uint n = n_in_of(g);
    uint slot = g == WO ? attn_slot() : act8_slot();
    uint d_at = slot + 4u * int8_quant_vec4s(n);
    return XSrc(g == QKV || g == GATE_UP, slot / 4u, d_at, d_at + 4u * int8_scale_vec4s(n));
}

// The int8 input at run index v16 (16 values): its quants, the scale of
// their block and d * (sum of their quants).
void x_run(XSrc x, uint v16, out uvec4 q, out float d, out float s) {
    if (x.staged) {
        q = sxq[v16];
        d = sxd[v16 / 2u];
        s = sxs[v16];
        return;
    }
    q = in8_4[x.q4 + v16];
    d = in8_f[x.d_at + v16 / 2u];
    s = in8_f[x.s_at + v16];
}

// Unit un (unit u of a row of type q6) times the input.
float unit_sum(bool q6, XSrc x, RUnit un, uint u) {
    float acc = 0.0;
    for (uint run = 0u; run < 2u; run++) {
        uvec4 codes;
        float scale;
        float offset;
        runit_codes(q6, un, run, codes, scale, offset);
        uvec4 q;
        float d;
        float s;
        x_run(x, runit_x4(q6, u, run) / 4u, q, d, s);
        acc += scale * (d * int_float(dot16(q, codes))) + offset * s;
    }
    return acc;
}

// This layer's tag of its activation values: its arrival counter's line
// (1 for the span's first layer), never 0 (the fill's).
uint layer_tag() {
    return counter_word_of(cur_layer) / 64u;
}

// Polls of tagged values (settle_block, attention_block) before a wait for
// them gives up and raises the failure word.
const uint TAG_SPIN_LIMIT = 1u << 20;

// Whether a poll of tagged values stops after its try `spins` without
// them: it gives up at TAG_SPIN_LIMIT tries (raising the failure word), or
// once a wait elsewhere gave up (checked every 4096 tries, as the grid-wide
// waits check it), so that a forward whose workgroups are not all
// resident ends after about one wait's spins.
bool tag_poll_ends(uint spins) {
    if (spins + 1u >= TAG_SPIN_LIMIT) {
        arrivals[FAILURE_WORD] = 1u;
        return true;
    }
    return (spins & 4095u) == 4095u && failure_raised();
}

// The activation's int8 blocks without a phase (and a grid-wide wait) of
// their own: block blk (rows 32 blk .. 32 blk + 31) is quantised into
// down's int8 input by the subgroup that summed its last row, lanes 0-7
// four values each, with the arithmetic of the int8 writers
// (quantise_part). Other subgroups store the block's other values, and no
// release orders their stores before this (a release per task would stall
// each task on its store), so each value carries its layer's tag, stored
// with it as one 8-byte word, and the quantiser loads them until all 32
// tags are this layer's; the host zeroes the tags before every forward.
// (In the Vulkan memory model these loads race with those stores; the
// scheme relies on an aligned 8-byte store and load each being single-copy
// atomic, as they are on the GPUs this opt-in kernel is tuned for.) The
// phase's arrival publishes the quants to down. Every lane of the
// subgroup must call it.
void settle_block(uint blk) {
    uint lane = gl_SubgroupInvocationID;
    bool mine = lane < 8u;
    vec4 v = vec4(0.0);
    if (mine) {
        uint at = p.act_tags / 4u + 16u * blk + 2u * lane;
        uint tag = layer_tag();
        for (uint spins = 0u;; spins++) {
            uvec4 a = tagged_poll4[at];
            uvec4 b = tagged_poll4[at + 1u];
            v = uintBitsToFloat(uvec4(a.x, a.z, b.x, b.z));
            if ((a.y == tag && a.w == tag && b.y == tag && b.w == tag) || tag_poll_ends(spins)) {
                break;
            }
        }
    }
    uint word;
    float d;
    float half_sum;
    quantise_part(v, word, d, half_sum);
    if (mine) {
        store_int8_word(act8_slot(), p.n_ff, 8u * blk + lane, word, d, half_sum);
    }
}

// This subgroup's place among all of the dispatch's.
uint subgroup_index() {
    return gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID;
}
uint subgroups() {
    return p.groups_x * gl_NumSubgroups;
}

// Stores task t's sums (s1: the up row's) as phase g keeps them; x_t is
// row t of x, loaded before the task's sums (wo and down).
void store_task(uint g, uint t, float s0, float s1, float x_t) {
    if (g == QKV) {
        // At its place in q | k | v.
        uint at = t < 2u * kv_dim() ? q_dim() + t : t - 2u * kv_dim();
        tagged[p.qkv_tags / 2u + at] = uvec2(floatBitsToUint(s0), layer_tag());
    } else if (g == GATE_UP) {
        // Tagged with the layer (its counter's line, 1 and up), so that
        // the block's quantiser can tell it from the zeroes of the fill
        // and from an earlier layer's value.
        float a = gated_act(s0, 0u) * s1;
        tagged[p.act_tags / 2u + t] = uvec2(floatBitsToUint(a), layer_tag());
    } else {
        // wo and down add into the residual stream; each row has one writer.
        x_f[t] = x_t + s0;
    }
}

// Task tk's sums (s1: the up row's), its rows of type q6; `ready` says
// that its first round is already in `ahead`. Called with q6 a constant, so
// that each type's loop is compiled apart.
void sum_task(bool q6, uint g, Task tk, XSrc x, bool ready, out float s0, out float s1) {
    uint units = lane_units(g);
    float acc[2] = float[2](0.0, 0.0);
    for (uint r = 0u; r < rounds_of(g); r++) {
        RUnit un[ROUND_UNITS];
        if (r == 0u && ready) {
            un = ahead;
        } else {
            load_round(q6, un, g, tk, r);
        }
        // acc[0] takes a lone row's even units, or the gate row's; acc[1]
        // the odd ones, or the up row's: each in the order of its units.
        for (uint k = 0u; k < ROUND_UNITS; k++) {
            uint row_k;
            uint j;
            round_place(g, r, k, row_k, j);
            if (j < units) {
                acc[k % 2u] += unit_sum(q6, x, un[k], gl_SubgroupInvocationID + gl_SubgroupSize * j);
            }
        }
    }
    s0 = g == GATE_UP ? subgroupAdd(acc[0]) : subgroupAdd(acc[0] + acc[1]);
    s1 = subgroupAdd(acc[1]);
}

// Sums this subgroup's tasks of matvec phase g, a round's units loaded
// then summed; `ready` says that the first round of the first task is
// already in `ahead`. (Loading each round while the one before is summed
// took 100 registers instead of 81 and was no faster; across tasks too, as
// one stream of rounds, 207-255 instead of 94; running the first
// task apart from the loop, so that `ahead` is not live in it, doubled the
// module, took more local memory and fell from 224 to 140 tok/s on
// llama-8b: docs/BENCHMARKS.md.)
void matvec_phase(uint g, inout bool ready) {
    XSrc x = x_src(g);
    for (uint t = subgroup_index(); t < tasks_of(g); t += subgroups()) {
        Task tk = task_of(g, t);
        // The residual row wo and down add to, loaded now so that its round
        // trip to L2 (x is coherent) overlaps the sums instead of following
        // them. No other task writes row t, and nothing in these phases
        // reads x, so its value is the one a load after the sums would see.
        float x_t = 0.0;
        if (g == WO || g == DOWN) {
            x_t = x_f[t];
        }
        float s0;
        float s1;
        // Both rows of a gate/up task share a type (persistent.rs checks it).
        if (is_q6(tk.ta)) {
            sum_task(true, g, tk, x, ready, s0, s1);
        } else {
            sum_task(false, g, tk, x, ready, s0, s1);
        }
        ready = false;
        if (subgroupElect()) {
            store_task(g, t, s0, s1, x_t);
        }
    }
}

// Phase SETTLE: the blocks of the activation whose last row this
// subgroup summed. It follows gate/up without a grid-wide wait, after all
// of the subgroup's tasks, when the blocks' other rows are mostly stored
// too: no task waits for them, and no register is held across the tasks
// for it (a block's arrival counted per task, its answer held until the
// next task, cost two registers and with them the fifth workgroup per
// multiprocessor on the H100).
void settle_phase() {
    for (uint t = subgroup_index(); t < tasks_of(GATE_UP); t += subgroups()) {
        if (t % 32u == 31u) {
            settle_block(t / 32u);
        }
    }
}

// Loads the first round of this subgroup's first task of matvec phase g,
// where it has one.
void load_ahead(uint g, inout bool ready) {
    bool matvec = g == QKV || g == WO || g == GATE_UP || g == DOWN;
    if (matvec && g < end_phase() && subgroup_index() < tasks_of(g)) {
        Task tk = task_of(g, subgroup_index());
        load_round(is_q6(tk.ta), ahead, g, tk, 0u);
        ready = true;
    }
}

// The matvec phase after phase g.
uint next_matvec(uint g) {
    if (g == QKV || g == ATTN) {
        return WO;
    } else if (g == WO) {
        return GATE_UP;
    }
    return g == DOWN ? NONE : DOWN;
}

// Words of x (and of the norm's weights) each invocation of stage_normed
// has in flight at once: x is read coherently, so each load is a round
// trip to L2 on the phase's critical path, and a loop of one load per
// iteration would wait for them one after another.
const uint NORM_LOADS = 4u;
// 16-byte words of a cached key, and cached value words, each invocation
// of the attention has in flight at once (the same reasoning). A run's
// key words are dealt to groups of up to 8 lanes, so a llama-8b key (16
// words) needs 2 per lane. Registers bound the kernel's residency (five
// workgroups per multiprocessor need at most 96): with runs, loads of 4
// and 8 took it to 98 registers on the H100 (four per multiprocessor, and
// fewer than five on the H200 too), 2 and 4 to 91 (docs/BENCHMARKS.md).
const uint KEY_LOADS = 2u;
const uint VALUE_LOADS = 4u;

// The RMS norm of x times the weights at float norm_off, quantised into the
// staging (sxq / sxd / sxs) with the int8 writers' arithmetic
// (quantise_part), in one pass over x: a block's quants do not depend on
// the norm's scale (they are its values over their largest), so the pass
// quantises x times the weights while it sums the squares, and the block
// scales and sums are multiplied by the norm's scale after the
// workgroup's sum: one round of loads of x where the sum of squares
// before the quantisation took two (H100 tg128 +2% on llama-1b, +1% on
// llama-8b; docs/BENCHMARKS.md). Every invocation must call it.
void stage_normed(uint norm_off) {
    uint tid = gl_LocalInvocationID.x;
    // n_in is a multiple of 1024, so every invocation takes the same
    // rounds: word i0 + k WG is in the row for all of them or for none
    // (the test on i0 - tid is uniform; past the row a load rereads the
    // last word and its value is not used).
    uint words = p.n_in / 4u;
    float sumsq = 0.0;
    for (uint i0 = tid; i0 < words; i0 += NORM_LOADS * WG) {
        vec4 xv[NORM_LOADS];
        vec4 wv[NORM_LOADS];
        [[unroll]] for (uint k = 0u; k < NORM_LOADS; k++) {
            uint i = min(i0 + k * WG, words - 1u);
            xv[k] = x_f4[i];
            wv[k] = params4[norm_off / 4u + i];
        }
        [[unroll]] for (uint k = 0u; k < NORM_LOADS; k++) {
            uint i = i0 + k * WG;
            if (i0 - tid + k * WG >= words) {
                break;
            }
            sumsq += dot(xv[k], xv[k]);
            uint word;
            float d;
            float half_sum;
            quantise_part(xv[k] * wv[k], word, d, half_sum);
            uint blk = i / 8u;
            uint part = i % 8u;
            sxq[i / 4u][i % 4u] = word;
            if (part == 0u) {
                sxd[blk] = d;
            }
            if (part % 4u == 0u) {
                sxs[2u * blk + part / 4u] = half_sum;
            }
        }
    }
    // Its barriers also order the staging's stores before the rescaling.
    float total = workgroup_sum(sumsq);
    float scale = 1.0 / sqrt(total / float(p.n_in) + p.eps);
    for (uint blk = tid; blk < p.n_in / 32u; blk += WG) {
        sxd[blk] *= scale;
        sxs[2u * blk] *= scale;
        sxs[2u * blk + 1u] *= scale;
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

// A token's attention is split into runs of consecutive positions, each
// a workgroup's (the heads' runs on the last workgroups, those with the
// fewest q/k/v tasks): one workgroup per head walked a llama-8b head's 128
// positions in 4 rounds of key loads and 8 of value loads, each a round
// trip, while hundreds of workgroups had nothing to do. Runs of at most
// RUN_KEYS positions take one round of each; there are at most MAX_RUNS
// per head, and at most as many as the workgroups give each head.
const uint RUN_KEYS = 16u;
const uint MAX_RUNS = 16u;
// Scratch words from one head's arrival counter to the next's
// (persistent.rs ATTENTION_COUNTER_WORDS).
const uint ATTN_COUNTER_WORDS = 16u;
// A run's partial result in the scratch: its head_dim weighted value sums,
// then its largest score and its sum of exponentials.
uint run_words() {
    return p.head_dim + 2u;
}

// Runs per head for a token attending to n_keys (>= 1) positions: none
// empty (the last holds the token's own position), each of
// ceil(n_keys / runs) (attention_run cuts them so).
uint attention_runs(uint n_keys) {
    // At least 1: n_keys is.
    uint want = min(min(MAX_RUNS, max(1u, p.groups_x / n_head())), (n_keys + RUN_KEYS - 1u) / RUN_KEYS);
    uint per_run = (n_keys + want - 1u) / want;
    return (n_keys + per_run - 1u) / per_run;
}

// Sums of lane groups of `lanes` consecutive invocations (a power of two up
// to the subgroup's size): every lane of the group gets the group's sum.
float lane_group_sum(float v, uint lanes) {
    for (uint o = 1u; o < lanes; o *= 2u) {
        v += subgroupShuffleXor(v, o);
    }
    return v;
}

// The head's values (head_out) quantised into wo's int8 input
// (int8_acts.glsl layout), four per invocation: whole blocks of 32, since
// head_dim is a multiple of 32 (persistent.rs checks it).
void store_head(uint hq) {
    uint quads = p.head_dim / 4u;
    uint tid = gl_LocalInvocationID.x;
    bool mine = tid < quads;
    vec4 v = vec4(0.0);
    if (mine) {
        v = vec4(head_out[4u * tid], head_out[4u * tid + 1u], head_out[4u * tid + 2u], head_out[4u * tid + 3u]);
    }
    uint packed;
    float scale;
    float half_sum;
    quantise_part(v, packed, scale, half_sum);
    if (mine) {
        store_int8_word(attn_slot(), q_dim(), hq * quads + tid, packed, scale, half_sum);
    }
}

// Shared: whether this workgroup's run was its head's last to arrive, and
// the runs' weights in its merge.
shared bool merges;
shared float run_weight[MAX_RUNS];
// Runs whose partial sums a merging invocation loads at once.
const uint MERGE_LOADS = 8u;

// Run `run` of `runs` of query head hq's attention for the step's token.
void attention_run(uint hq, uint run, uint runs) {
    uint pos = step_words[0];
    uint row0 = step_words[2];
    uint group = n_head() / n_kv();
    uint j = hq / group;
    uint d_head = p.head_dim;
    uint tid = gl_LocalInvocationID.x;
    uint row_words = kv_dim() / 2u;
    uint k_src = p.qkv_tags / 2u + q_dim() + j * d_head;
    uint v_src = k_src + kv_dim();
    uint q_src = p.qkv_tags / 2u + hq * d_head;
    // The token's key and value (its KV head's) and query (this head's),
    // one value pair or value per invocation (head_dim <= WG, persistent.rs
    // checks it), loaded together: each is a coherent load, a round trip
    // to L2, and loaded one loop after another they waited for each other.
    // No grid-wide wait came before: they are loaded again until all carry
    // this layer's tag (each value and its tag are one 8-byte store, see
    // settle_block).
    bool pair_lane = tid < d_head / 2u;
    bool value_lane = tid < d_head;
    uvec2 e = head_pair(min(tid, d_head / 2u - 1u));
    uint tag = layer_tag();
    uvec2 ka;
    uvec2 kb;
    uvec2 qa;
    uvec2 qb;
    uvec2 va;
    for (uint spins = 0u;; spins++) {
        ka = tagged_poll[k_src + e.x];
        kb = tagged_poll[k_src + e.y];
        qa = tagged_poll[q_src + e.x];
        qb = tagged_poll[q_src + e.y];
        va = tagged_poll[v_src + min(tid, d_head - 1u)];
        bool pairs_in = !pair_lane || (ka.y == tag && kb.y == tag && qa.y == tag && qb.y == tag);
        if ((pairs_in && (!value_lane || va.y == tag)) || tag_poll_ends(spins)) {
            break;
        }
    }
    vec2 k_in = uintBitsToFloat(uvec2(ka.x, kb.x));
    vec2 q_in = uintBitsToFloat(uvec2(qa.x, qb.x));
    float v_in = uintBitsToFloat(va.x);
    if (pair_lane) {
        vec2 cs = rope_angle(p.rope_table, pos, d_head, tid);
        vec2 r = rope_rotate(k_in.x, k_in.y, cs);
        kc[e.x] = f16_round(r.x);
        kc[e.y] = f16_round(r.y);
        vec2 rq = rope_rotate(q_in.x, q_in.y, cs);
        qr[e.x] = rq.x;
        qr[e.y] = rq.y;
    }
    if (value_lane) {
        vc[tid] = f16_round(v_in);
    }
    barrier();
    uint n_keys = pos + 1u;
    uint per_run = (n_keys + runs - 1u) / runs;
    uint t0 = run * per_run;
    uint t1 = min(t0 + per_run, n_keys);
    uint head_words = j * d_head / 2u;
    // The last run holds the token's own position; the group's first query
    // head stores its key and value as f16 at the token's KV row.
    if (hq % group == 0u && run + 1u == runs) {
        uint at = (row0 + pos) * row_words + head_words;
        for (uint i = tid; i < d_head / 2u; i += WG) {
            keys[layer_slot()].k_cache[at + i] = packHalf2x16(vec2(kc[2u * i], kc[2u * i + 1u]));
            values[layer_slot()].v_cache[at + i] = packHalf2x16(vec2(vc[2u * i], vc[2u * i + 1u]));
        }
    }
    // Scores of the run's positions into the staging's words (as float
    // bits; SCORE, by position within the run): each position's 16-byte
    // key words dealt to a group of `lanes` consecutive invocations,
    // KEY_LOADS of them in flight at once, their products summed across
    // the group (a llama-8b run of 16 positions: 8 lanes of 2 words, one
    // round trip).
    uint key_words = d_head / 8u;
    uint lanes = 1u;
    while (lanes < key_words && lanes < gl_SubgroupSize && (WG / (2u * lanes)) >= per_run) {
        lanes *= 2u;
    }
    uint lane = tid % lanes;
    float m = -3.0e38;
    for (uint b = t0; b < t1; b += WG / lanes) {
        uint t = b + tid / lanes;
        float s = 0.0;
        if (t == pos) {
            for (uint w = lane; w < key_words; w += lanes) {
                for (uint d = 8u * w; d < 8u * w + 8u; d++) {
                    s += qr[d] * kc[d];
                }
            }
        } else if (t < t1) {
            uint kw = (row0 + t) * row_words + head_words;
            for (uint c = lane; c < key_words; c += KEY_LOADS * lanes) {
                uvec4 k4[KEY_LOADS];
                [[unroll]] for (uint u = 0u; u < KEY_LOADS; u++) {
                    k4[u] = keys4[layer_slot()].k_cache4[kw / 4u + min(c + u * lanes, key_words - 1u)];
                }
                [[unroll]] for (uint u = 0u; u < KEY_LOADS; u++) {
                    if (c + u * lanes >= key_words) {
                        break;
                    }
                    uint d0 = 8u * (c + u * lanes);
                    for (uint q = 0u; q < 4u; q++) {
                        vec2 k = unpackHalf2x16(k4[u][q]);
                        s += qr[d0 + 2u * q] * k.x + qr[d0 + 2u * q + 1u] * k.y;
                    }
                }
            }
        }
        s = lane_group_sum(s, lanes) * p.attn_scale;
        if (t < t1) {
            if (lane == 0u) {
                SCORE(t - t0) = floatBitsToUint(s);
            }
            m = max(m, s);
        }
    }
    m = workgroup_max(m);
    float sum = 0.0;
    for (uint i = tid; i < t1 - t0; i += WG) {
        float x = exp(uintBitsToFloat(SCORE(i)) - m);
        SCORE(i) = floatBitsToUint(x);
        sum += x;
    }
    sum = workgroup_sum(sum);
    // The weighted values: each thread owns one word (two dimensions) and
    // every sets-th cached position of the run, VALUE_LOADS loads issued
    // together (a round trip each time); the token's own value comes from
    // vc.
    uint words = d_head / 2u;
    uint sets = WG / words;
    uint word = tid % words;
    uint set = tid / words;
    uint cached_end = min(t1, pos);
    vec2 o = vec2(0.0);
    if (set < sets) {
        uint vw = row0 * row_words + head_words + word;
        for (uint ta = t0 + set; ta < cached_end; ta += VALUE_LOADS * sets) {
            uint vl[VALUE_LOADS];
            [[unroll]] for (uint u = 0u; u < VALUE_LOADS; u++) {
                uint t = min(ta + u * sets, cached_end - 1u);
                vl[u] = values[layer_slot()].v_cache[vw + t * row_words];
            }
            [[unroll]] for (uint u = 0u; u < VALUE_LOADS; u++) {
                if (ta + u * sets >= cached_end) {
                    break;
                }
                o += uintBitsToFloat(SCORE(ta + u * sets - t0)) * unpackHalf2x16(vl[u]);
            }
        }
    }
    out_parts[2u * tid] = o.x;
    out_parts[2u * tid + 1u] = o.y;
    barrier();
    float own = t1 == n_keys ? uintBitsToFloat(SCORE(pos - t0)) : 0.0;
    float run_o = 0.0;
    if (tid < d_head) {
        run_o = own * vc[tid];
        for (uint k = 0u; k < sets; k++) {
            run_o += out_parts[2u * (k * words + tid / 2u) + (tid & 1u)];
        }
    }
    if (runs == 1u) {
        if (tid < d_head) {
            head_out[tid] = run_o / sum;
        }
        barrier();
        store_head(hq);
        // The staging's words, qr, kc, vc and head_out serve the
        // workgroup's next run.
        barrier();
        return;
    }
    // Several runs: this one's sums to the scratch, then the head's counter;
    // the last run to arrive merges them all (no workgroup waits for
    // another, so the runs need not be resident together). The stores
    // are published as arrive() publishes a phase's: the workgroup meets,
    // then one invocation's device-scope release (with the acquire that
    // the merge needs).
    uint parts = p.attn_parts + hq * MAX_RUNS * run_words();
    uint mine = parts + run * run_words();
    if (tid < d_head) {
        vec_f[mine + tid] = run_o;
    }
    if (tid == 0u) {
        vec_f[mine + d_head] = m;
        vec_f[mine + d_head + 1u] = sum;
    }
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeWorkgroup, gl_StorageSemanticsBuffer,
        gl_SemanticsAcquireRelease);
    uint counter = p.attn_counts + ATTN_COUNTER_WORDS * hq;
    if (tid == 0u) {
        uint before = atomicAdd(arrivals[counter], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer,
            gl_SemanticsAcquireRelease);
        merges = before + 1u == runs;
    }
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeWorkgroup, gl_StorageSemanticsBuffer | gl_StorageSemanticsShared,
        gl_SemanticsAcquireRelease);
    if (merges) {
        // Each run's largest score and sum by one invocation each (loaded
        // together), every run's weight exp(its largest - the largest of
        // all) in shared memory, then each dimension's sums weighted, in
        // run order, MERGE_LOADS runs' loads in flight at once.
        float run_m = -3.0e38;
        float run_l = 0.0;
        if (tid < runs) {
            run_m = vec_f[parts + tid * run_words() + d_head];
            run_l = vec_f[parts + tid * run_words() + d_head + 1u];
        }
        float top = workgroup_max(run_m);
        float w = exp(run_m - top);
        if (tid < runs) {
            run_weight[tid] = w;
        }
        float total = workgroup_sum(tid < runs ? w * run_l : 0.0);
        float acc = 0.0;
        if (tid < d_head) {
            for (uint r0 = 0u; r0 < runs; r0 += MERGE_LOADS) {
                float ov[MERGE_LOADS];
                [[unroll]] for (uint u = 0u; u < MERGE_LOADS; u++) {
                    ov[u] = vec_f[parts + min(r0 + u, runs - 1u) * run_words() + tid];
                }
                [[unroll]] for (uint u = 0u; u < MERGE_LOADS; u++) {
                    if (r0 + u < runs) {
                        acc += run_weight[r0 + u] * ov[u];
                    }
                }
            }
            head_out[tid] = acc / total;
        }
        if (tid == 0u) {
            // Ready for the next layer's runs (published by the phase's
            // arrival).
            arrivals[counter] = 0u;
        }
        barrier();
        store_head(hq);
    }
    // The staging's words, qr, kc, vc, head_out and `merges` serve the
    // workgroup's next run.
    barrier();
}

// The dispatch's phases of its layers as one loop over (layer, phase)
// steps: a loop over the layers around the loop over the phases took the
// kernel from 98 to 109 registers on the H100 (docs/BENCHMARKS.md).
void main() {
    uint first = first_phase();
    uint span = end_phase() - first;
    bool ready = false;
    set_layer(first_layer());
    load_ahead(first == ATTN ? WO : (first == SETTLE ? DOWN : first), ready);
    uint steps = (p.layers >> 16) * span;
    for (uint s = 0u; s < steps; s++) {
        uint il = first_layer() + s / span;
        uint g = first + s % span;
        set_layer(il);
        // The layer before in this dispatch has written x: every workgroup
        // arrived after its six phases.
        if (g == first && il > first_layer()) {
            wait_on(counter_word_of(il - 1u), PHASES);
        }
        // The attention and the settling wait for their own inputs
        // (attention_block, settle_block); every phase still arrives, so
        // that the count before phase g is g arrivals per workgroup.
        if (g > first && g != ATTN && g != SETTLE) {
            wait_for(g - first);
        }
        if (g == SETTLE) {
            settle_phase();
        } else if (g == ATTN) {
            // Runs on the last workgroups: with k and v first, q/k/v's
            // tasks fall on the first ones in its last round. Items of
            // one run index are the heads' in turn, so that the first
            // workgroups of the attention hold every head's first run.
            uint runs = attention_runs(step_words[0] + 1u);
            for (uint w = p.groups_x - 1u - gl_WorkGroupID.x; w < n_head() * runs; w += p.groups_x) {
                attention_run(w % n_head(), w / n_head(), runs);
            }
        } else {
            // Uniform: whether any subgroup of the workgroup has a task.
            bool sums = gl_WorkGroupID.x * gl_NumSubgroups < tasks_of(g);
            if (sums && (g == QKV || g == GATE_UP)) {
                uint norms = p.norm_stride * (il - first_layer());
                stage_normed((g == QKV ? p.attn_norm : p.ffn_norm) + norms);
            }
            // Each matvec phase compiled apart, its phase a constant, so
            // that its tasks' shape folds: 12% off a llama-8b layer
            // against one loop taking the phase at run time, at the same
            // registers (docs/BENCHMARKS.md). The optimiser of Debian 12's
            // glslc crashes on it (shader_set.rs SPIRV_OPT_MODULES).
            if (g == QKV) {
                matvec_phase(QKV, ready);
            } else if (g == WO) {
                matvec_phase(WO, ready);
            } else if (g == GATE_UP) {
                matvec_phase(GATE_UP, ready);
            } else {
                matvec_phase(DOWN, ready);
            }
        }
        arrive();
        // After the arrival's release, which waits for the invocation's
        // outstanding memory operations: loads ahead issued before it
        // would hold the arrival back by their latency; here they stream
        // while the other workgroups arrive. After down, the next
        // layer's q/k/v, where this dispatch runs it.
        if (g == DOWN && il + 1u < end_layer()) {
            // (The next step sets its own layer.)
            set_layer(il + 1u);
            load_ahead(QKV, ready);
        } else if (g != ATTN && g != SETTLE) {
            load_ahead(next_matvec(g), ready);
        }
    }
}
