#version 450
// Matrix-vector products on int8 activations, for the quantised types (those
// with decode_codes in matvec_units.glsl). The float kernel (matvec.comp)
// spends most of its instructions turning codes into floats and multiplying
// them one by one, which caps it well below the memory roof; here every four
// codes meet four int8 activations in one packed dot product
// (SPV_KHR_integer_dot_product, shaderIntegerDotProduct).
//
// Each pass over NT tokens first quantises their x into shared memory, in
// blocks of 32 values with one scale d = max|x| / 127 (the blocks of the CPU
// kernels' Q8_0/Q8_1 activations, so that both round alike), and keeps
// d * (sum of the block's quants) per 16 values: a run of 16 weights adds
//     scale * d * dot(codes, xq) + (minv - scale * CODE_OFFSET) * d * sum(xq),
// which is exactly the dequantised weights times the quantised activations.
// (Blocks of 16 measured further from the CPU's logits, 6.2% against 5.1%
// of max |logit| on SmolLM2, though each block is finer.)
// With X_PREQUANTISED, x arrives already quantised that way (int8_acts.glsl,
// written by the norm before the matvec) and the pass only copies it into
// shared memory: the quantisation is then done once per token, not once
// per workgroup.
// The weight loop, the workgroup shape and the reduction are those of
// matvec.comp (same units, same specialisation constants 0-3); constant 4 is
// n_in / 16, which sizes the shared activations.
//
// With GATE_UP_INT8 (on pre-quantised x) it is the gate/up matvec of an
// int8 decode step with the activation in its epilogue: a workgroup holds
// 2 * 32 / ROWS slices of WG invocations, each computing ROWS rows exactly as
// a workgroup of the plain kernel does (the same units, sums and reduction,
// so the same bits), the first half over the gate weights and the second
// over the up weights (binding 5) of the same 32 rows. The 32 values
// act(gate) * up of each token then form one block, which the epilogue
// quantises into the int8 layout (binding 2) exactly as span_act.comp does,
// for the down projection: no act*mul dispatch, and no barrier before it.
// Constant 5 is the activation (0 SiLU, 1 tanh GELU), constant 6 the
// workgroup size.
//
// With NORM_PROLOGUE as well (and x not pre-quantised) the gate/up kernel
// also does the feed-forward norm before it: x at binding 1 is the
// residual stream of one token, the norm's weights are at float
// p.norm_off of binding 3, and each workgroup first computes the normed
// token quantised into shared memory (load_x_normed) with the arithmetic
// of span_rmsnorm.comp's int8 path, so its quants are the bits the norm
// dispatch would have written and the products are those of the kernel on
// pre-quantised x; the norm's dispatch and barrier go.
//
// With SLICED and NORM_PROLOGUE (no GATE_UP_INT8) it is the plain matvec
// of one token with the attention norm in the same prologue (q/k/v of a
// decode step): WG_ALL / WG slices of WG invocations, each computing ROWS
// rows exactly as a workgroup of the kernel on pre-quantised x does (the
// same units, sums and reduction), so the same bits, and storing them as
// that kernel does.
//
// In that q/k/v form, with p.split_count_off non-zero (a decode step whose
// attention runs beside the matvec, span_attention_split.comp WAIT_QKV), each
// workgroup stores its rows through a coherent binding and then counts
// them in at the arrival word of each KV head they belong to (binding 4:
// the span's step buffer): p.split rows of its matrix per KV head (q:
// n_head / n_head_kv heads of head_dim, k: head_dim, v: head_dim_v),
// p.split_part_off the matrix's first row in the output, p.split_count_off
// the first head's word (two words a head).
//
// With SLICED and WAIT_X (no NORM_PROLOGUE; x in the pre-quantised layout,
// one token) it is the wo projection of a decode step whose attention runs
// right before it with no barrier between them
// (span_attention_split.comp counts each head's output in): each
// invocation first loads its first round of UNROLL weight units (by
// default its whole share of the row; FISH_VK_WAIT_UNITS caps it, the
// later rounds loading after the wait), so the loads stream while the
// attention runs, then
// the workgroup waits until p.split heads have arrived at word
// p.split_count_off of binding 4 (the span's step buffer), copies the
// attention's int8 copy from a coherent binding into shared memory and
// sums. Each slice computes ROWS rows exactly as a workgroup of the kernel
// on pre-quantised x does (the same units in the same order, the same
// reduction), so the same bits. With p.parts non-zero the loads wait first
// until p.parts KV heads have passed their q/k/v wait (word
// p.split_count_off + 1): the weights then stream beside the attention,
// not beside the q/k/v matvec's own stream. A wait that polls X_SPINS times sets word
// p.split_part_off of binding 5 (the host-visible step buffer), and the
// host runs the forward again with barriers. The residual's old values are
// read before the wait (nothing between the last barrier and this kernel
// writes them).
//
// With GATE_UP_NARROW (on pre-quantised x) it is the gate/up matvec of an
// int8 decode step in narrow workgroups: one slice of WG invocations
// computing ROWS / 2 rows of gate and the same rows of up, each exactly as
// a workgroup of the plain kernel does (so the same bits as the
// GATE_UP_INT8 form), whose act(gate) * up go to a scratch at binding 4.
// A block of the int8 copy then spans 64 / ROWS workgroups: each counts
// itself in at the block's arrival counter (binding 4 too, zeroed before
// the first use), and the last to arrive quantises the block from the
// scratch as the GATE_UP_INT8 epilogue does. The narrow form keeps many
// short workgroups in flight, as the plain kernel does, where the 32-row
// blocks of GATE_UP_INT8 make few long ones.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_spirv_intrinsics : require
#extension GL_EXT_control_flow_attributes : enable
#if defined(SLICED) || defined(GATE_UP_NARROW)
// The q/k/v rows' count-in, the waiting wo's waits and the narrow gate/up's
// block count-in (handoff.glsl).
#extension GL_KHR_memory_scope_semantics : require
#endif
#if defined(GATE_UP_INT8) || defined(GATE_UP_NARROW)
#define GATE_UP_EPILOGUE 1
#endif
#if defined(GATE_UP_EPILOGUE) || defined(NORM_PROLOGUE)
// Blocks quantised within subgroups (int8_acts.glsl quantise_part): the
// prologue's quantisation and the gate/up epilogue's take no barrier.
#extension GL_KHR_shader_subgroup_shuffle : require
#define QUANT_IN_SUBGROUP 1
#endif

layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint ROWS = 4;
layout(constant_id = 2) const uint NT = 1;
layout(constant_id = 3) const uint UNROLL = 1;
layout(constant_id = 4) const uint IN_VEC4 = 16;
#if defined(GATE_UP_EPILOGUE) || defined(SLICED)
layout(constant_id = 5) const uint GELU = 0;
#endif
#if defined(GATE_UP_INT8) || defined(SLICED)
layout(constant_id = 6) const uint WG_ALL = 512;
layout(local_size_x_id = 6) in;
#endif
#if defined(GATE_UP_INT8)
// Rows of a block: each workgroup's output rows.
const uint BLOCK_ROWS = 32u;
const uint SLICES = 2u * BLOCK_ROWS / ROWS;
#elif defined(SLICED)
const uint SLICES = WG_ALL / WG;
#else
layout(local_size_x_id = 0) in;
#endif
#if defined(GATE_UP_NARROW)
// Rows of a block, and of each matrix in a workgroup.
const uint BLOCK_ROWS = 32u;
const uint OUT_ROWS = ROWS / 2u;
const uint SLICES = 1u;
#endif

#define USE_SUBGROUP 1
#include "common.glsl"
layout(std430, binding = 0) readonly buffer Weights4 { uvec4 w4[]; };
#include "dequant.glsl"
#include "matvec_units.glsl"
#if defined(GATE_UP_EPILOGUE)
layout(std430, binding = 5) readonly buffer UpWeights { uint up_w[]; };
layout(std430, binding = 5) readonly buffer UpWeights4 { uvec4 up_w4[]; };
// load_up_unit: load_unit over the up weights.
#define LOAD_UNIT load_up_unit
#define LOAD_WORDS4 up_w4
#define LOAD_WORDS up_w
#define TOUCH_UNIT touch_up_unit
#include "matvec_loads.glsl"
#undef LOAD_UNIT
#undef LOAD_WORDS4
#undef LOAD_WORDS
#undef TOUCH_UNIT
#include "gated_act.glsl"
// The block's int8 copy (int8_acts.glsl) goes to binding 2.
layout(std430, binding = 2) writeonly buffer Int8Out { uint q8[]; };
#define INT8_PARTS_WRITER 1
#include "int8_acts.glsl"
float acc[ROWS][NT];
// Per slice, row and token: the partial sums of its subgroups (at least 4
// invocations each).
shared float partial[SLICES][ROWS * NT][WG / 4u];
#if defined(GATE_UP_INT8)
// The gate and up values of the block.
shared float block_sums[SLICES * ROWS][NT];
#else
// The arrival counters, one per block of the int8 copy, then the scratch of
// act(gate) * up (act_at). Coherent: the last workgroup of a block reads
// what the others wrote.
layout(std430, binding = 4) coherent buffer Arrivals { uint arrivals[]; };
layout(std430, binding = 4) coherent buffer ActScratch { float act_scratch[]; };
// Whether this workgroup arrived last at its block.
shared uint last_here;
#endif
#elif defined(SLICED)
#if defined(NORM_PROLOGUE)
#define INT8_PARTS 1
#include "int8_acts.glsl"
#endif
#if defined(WAIT_X)
// The attention's int8 copy as it arrives, and the host-visible failure word.
layout(std430, binding = 1) coherent readonly buffer XLive4 { uvec4 x_live4[]; };
layout(std430, binding = 1) coherent readonly buffer XLiveF { float x_live_f[]; };
layout(std430, binding = 5) coherent writeonly buffer WaitFailed { uint wait_failed[]; };
// Non-zero: the sums read the int8 copy straight from binding 1 (coherent
// loads per run) instead of staging it in shared memory after the wait
// (kernels.rs, FISH_VK_WAIT_DIRECT_X; tuning). The same values either way.
layout(constant_id = 7) const uint DIRECT_X_SPEC = 0;
const bool DIRECT_X = DIRECT_X_SPEC != 0u;
// Polls of the arrival word before a wait gives up (below 65535: on
// lavapipe a longer loop ends the invocation running it, grid_wait.glsl).
#define X_SPINS 60000u
#endif
// The q/k/v rows as the attention beside the matvec reads them, and its
// arrival words (p.split_count_off non-zero).
layout(std430, binding = 2) coherent buffer YLive { float y_live[]; };
layout(std430, binding = 4) coherent buffer QkvArrivals { uint qkv_arrivals[]; };
float acc[ROWS][NT];
// Per slice, row and token: the partial sums of its subgroups.
shared float partial[SLICES][ROWS * NT][WG / 4u];
#else
#include "matvec_reduce.glsl"
#endif

#include "int8_dot.glsl"
#if defined(SLICED) || defined(GATE_UP_NARROW)
#include "handoff.glsl"
#endif

// Per token: the quants (16 per uvec4), the scale of each 32 values and
// d * (sum of quants) of each 16.
#if !defined(X_PREQUANTISED)
shared uvec4 xq[NT * IN_VEC4];
shared float xd[NT * IN_VEC4 / 2u];
shared float xs[NT * IN_VEC4];
#endif

#if defined(X_PREQUANTISED)
#if !defined(GATE_UP_EPILOGUE)
#include "int8_acts.glsl"
#endif
layout(std430, binding = 1) readonly buffer XQ { uvec4 x_int8[]; };
layout(std430, binding = 1) readonly buffer XQF { float x_int8_f[]; };

// Nothing to prepare: the runs read the quantised x straight from memory
// (16 bytes of quants where the float kernel reads 64 of x), so no barrier
// holds the weight loads back.
void load_x(uint t0) {}

// The quants (16 values from value 16 * v16), their scale and d * sum.
void x_run(uint t, uint v16, out uvec4 q, out float d, out float s) {
    uint n = p.n_in;
    uint tok = min(t, p.n_tok - 1u);
    uint base = tok * int8_token_vec4s(n);
    uint scales = int8_scales_vec4(tok, n);
    uint sums = int8_sums_vec4(tok, n);
    q = x_int8[base + v16];
    d = x_int8_f[4u * scales + v16 / 2u];
    s = x_int8_f[4u * sums + v16];
}
#else
// The block arithmetic of the int8 writers (max_abs4, quants4, ...).
#include "int8_acts.glsl"

// Quantises the x of tokens t0 .. t0 + NT - 1 (past the end: the last token).
void load_x(uint t0) {
    uint blocks = p.n_in / 32u;
    for (uint i = gl_LocalInvocationID.x; i < NT * blocks; i += WG) {
        uint t = i / blocks;
        uint b = i % blocks;
        uint src = min(t0 + t, p.n_tok - 1u) * (p.n_in / 4u) + 8u * b;
        vec4 v[8];
        float amax = 0.0;
        for (uint k = 0u; k < 8u; k++) {
            v[k] = x[src + k];
            amax = max(amax, max_abs4(v[k]));
        }
        float d = amax / 127.0;
        float id = inverse_step(amax);
        uint words[8];
        int sums[2] = int[2](0, 0);
        for (uint k = 0u; k < 8u; k++) {
            ivec4 q = quants4(v[k], id);
            sums[k / 4u] += sum4(q);
            words[k] = pack_quants(q);
        }
        uint dst = t * IN_VEC4 + 2u * b;
        xq[dst] = uvec4(words[0], words[1], words[2], words[3]);
        xq[dst + 1u] = uvec4(words[4], words[5], words[6], words[7]);
        xd[t * (IN_VEC4 / 2u) + b] = d;
        xs[dst] = d * float(sums[0]);
        xs[dst + 1u] = d * float(sums[1]);
    }
}

void x_run(uint t, uint v16, out uvec4 q, out float d, out float s) {
#if defined(WAIT_X)
    if (DIRECT_X) {
        // One token, read where it arrived (coherently), not staged.
        q = x_live4[v16];
        d = x_live_f[4u * int8_scales_vec4(0u, p.n_in) + v16 / 2u];
        s = x_live_f[4u * int8_sums_vec4(0u, p.n_in) + v16];
        return;
    }
#endif
    uint at = (t % NT) * IN_VEC4 + v16;
    q = xq[at];
    d = xd[at / 2u];
    s = xs[at];
}
#endif

#if defined(NORM_PROLOGUE)
// Rows of an invocation's first weight round loaded before the prologue,
// so that they stream while it runs (0: none; at most the rows of a round;
// kernels.rs `FISH_VK_PRELOAD_ROWS`). No row's sums change with it.
layout(constant_id = 8) const uint PRELOAD_ROWS = 0;
const bool PRELOAD = PRELOAD_ROWS > 0u;
// Rows of an invocation's first weight round touched before the prologue
// (0: none; kernels.rs `FISH_VK_TOUCH_ROWS`): one word of each 32-byte
// sector its units' loads will read (touch_unit, K-quants only), so that
// the sectors stream into the caches while the prologue runs and the
// round's loads find them there. Unlike PRELOAD_ROWS the words are folded
// into one register (touch_word) and consumed at the prologue's end, not
// kept for the round. No row's sums change.
layout(constant_id = 9) const uint TOUCH_ROWS = 0;
uint touch_word = 0u;
layout(std430, binding = 3) readonly buffer NormWeights4 { vec4 norm_w4[]; };
shared float norm_partial[WG_ALL];
shared float norm_partial16[16];
// Words of x held per invocation by the prologue (load_x_normed).
const uint HELD_WORDS = 4u;

// Quantises word w (v, 4 values; in_row false past the row's end) into
// xq / xd / xs: part w % 8 of block w / 8, as store_int8_part writes it.
// Every invocation must call it (the block meets in its subgroup); the
// caller's barrier makes the words visible.
void quantise_word(vec4 v, bool in_row, uint w) {
    uint word;
    float d;
    float half_sum;
    quantise_part(v, word, d, half_sum);
    if (in_row) {
        uint part = gl_LocalInvocationID.x % 8u;
        uint blk = w / 8u;
        xq[w / 4u][w % 4u] = word;
        if (part == 0u) {
            xd[blk] = d;
        }
        if (part % 4u == 0u) {
            xs[2u * blk + part / 4u] = half_sum;
        }
    }
}

// The RMS norm of token 0 of x times the weights at float p.norm_off,
// quantised into xq / xd / xs (the layout x_run reads): span_rmsnorm.comp's
// int8 path on 16-byte words step for step (its 256 invocations, sums in
// the same order, the same roundings), so every workgroup holds the quants
// that norm would write. Needs WG_ALL == 256 and n_in and p.norm_off
// multiples of 4 (kernels.rs checks both). Every invocation must call it.
void load_x_normed() {
    uint tid = gl_LocalInvocationID.x;
    uint words = p.n_in / 4u;
    uint w_base = p.norm_off / 4u;
    // With weights preloaded, both passes over the words (the sum of
    // squares, then the quantisation) load them: held across the reduction
    // they would take registers beside the preloaded units, and the second
    // loads come from L1. Without, each invocation keeps the words of its
    // first loads (x and the norm's weights, all of a row of up to
    // 4 * WG_ALL words: 4096 values) in registers, so the quantisation
    // waits for no second round of loads.
    vec4 xv[HELD_WORDS];
    vec4 gv[HELD_WORDS];
    uint held = PRELOAD ? 0u : HELD_WORDS;
    [[unroll]] for (uint k = 0u; k < HELD_WORDS; k++) {
        uint w = tid + k * WG_ALL;
        bool in_row = w < words && k < held;
        xv[k] = in_row ? x[w] : vec4(0.0);
        gv[k] = in_row ? norm_w4[w_base + w] : vec4(0.0);
    }
    float sum = 0.0;
    [[unroll]] for (uint k = 0u; k < HELD_WORDS; k++) {
        if (tid + k * WG_ALL < words && k < held) {
            sum += dot(xv[k], xv[k]);
        }
    }
    for (uint i = tid + held * WG_ALL; i < words; i += WG_ALL) {
        vec4 v = x[i];
        sum += dot(v, v);
    }
    norm_partial[tid] = sum;
    barrier();
    if (tid < 16u) {
        float s16 = 0.0;
        for (uint k = 0u; k < 16u; k++) {
            s16 += norm_partial[16u * tid + k];
        }
        norm_partial16[tid] = s16;
    }
    barrier();
    float total = 0.0;
    for (uint k = 0u; k < 16u; k++) {
        total += norm_partial16[k];
    }
    float scale = 1.0 / sqrt(total / float(p.n_in) + p.norm_eps);
    [[unroll]] for (uint k = 0u; k < HELD_WORDS; k++) {
        // Uniform: every invocation takes the same rounds.
        if (k * WG_ALL < words && k < held) {
            uint w = tid + k * WG_ALL;
            bool in_row = w < words;
            quantise_word(in_row ? xv[k] * scale * gv[k] : vec4(0.0), in_row, w);
        }
    }
    uint j_rest = held * WG_ALL;
    for (uint j0 = j_rest; j0 < words; j0 += WG_ALL) {
        uint w = j0 + tid;
        bool in_row = w < words;
        quantise_word(in_row ? x[w] * scale * norm_w4[w_base + w] : vec4(0.0), in_row, w);
    }
    // The touched words meet here, under p.parts (0 in these kernels: the
    // deferred norm's parts belong to matvec.comp), so that they are
    // loaded and change nothing.
    if ((touch_word & p.parts) != 0u) {
        xd[0] = 0.0;
    }
    barrier();
}
#endif

#if defined(GATE_UP_INT8)
// Rows whose units one round loads together (a divisor of ROWS): fewer than
// ROWS hold fewer units in registers, so that more workgroups fit at once
// (kernels.rs `int8_gate_up_load_rows`). No row's sums change.
layout(constant_id = 7) const uint RG = 8;
#else
#define RG ROWS
#endif

// Loads units u0, u0 + WG, ... (UNROLL of them) of rows rg .. rg + RG - 1
// from the weights at binding 0, or with GATE_UP_INT8 and `up` from the up
// weights; units past the end reload u0 (skipped when computing).
Unit load_row_unit(uint row_byte, uint u, bool up) {
#if defined(GATE_UP_EPILOGUE)
    return up ? load_up_unit(row_byte, u) : load_unit(row_byte, u);
#else
    return load_unit(row_byte, u);
#endif
}

// touch_unit over the same weights as load_row_unit.
uint touch_row_unit(uint row_byte, uint u, bool up) {
#if defined(GATE_UP_EPILOGUE)
    return up ? touch_up_unit(row_byte, u) : touch_unit(row_byte, u);
#else
    return touch_unit(row_byte, u);
#endif
}

// The unit that the i-th of UNROLL loads from u0 reads (past the end: u0,
// whose sums are skipped).
uint unrolled_unit(uint u0, uint i, uint n_units) {
    return u0 + i * WG < n_units ? u0 + i * WG : u0;
}

// Whether row r of a workgroup is an up row: the second half of a narrow
// gate/up workgroup's rows.
bool is_up_row(uint r) {
#if defined(GATE_UP_NARROW)
    return r >= OUT_ROWS;
#else
    return false;
#endif
}

void load_units(out Unit un[UNROLL][RG], uint row_byte[ROWS], uint rg, uint u0, uint n_units, bool up) {
    for (uint i = 0u; i < UNROLL; i++) {
        uint u = unrolled_unit(u0, i, n_units);
        for (uint r = 0u; r < RG; r++) {
            un[i][r] = load_row_unit(row_byte[rg + r], u, up || is_up_row(rg + r));
        }
    }
}

#if defined(NORM_PROLOGUE)
// The units of the first PRELOAD_ROWS rows of an invocation's first round
// (from unit tid), loaded before the norm prologue; sum_pass takes them
// instead of loading them. Their registers are live across the prologue,
// which then holds no words of x (load_x_normed).
const uint PRELOAD_SLOTS = PRELOAD ? PRELOAD_ROWS : 1u;
Unit first_round[UNROLL][PRELOAD_SLOTS];
bool first_round_pending = false;

// Touches the first TOUCH_ROWS rows of the invocation's first round (units
// from unit tid) before the prologue.
void touch_first_round(uint row_byte[ROWS], uint tid, bool up) {
    uint n_units = p.n_in / UNIT_VALUES;
    uint u = min(tid, n_units - 1u);
    for (uint r = 0u; r < min(TOUCH_ROWS, uint(ROWS)); r++) {
        touch_word ^= touch_row_unit(row_byte[r], u, up);
    }
}

void preload_first_round(uint row_byte[ROWS], uint tid, bool up) {
    if (!PRELOAD) {
        return;
    }
    uint n_units = p.n_in / UNIT_VALUES;
    for (uint i = 0u; i < UNROLL; i++) {
        uint u = unrolled_unit(tid, i, n_units);
        for (uint r = 0u; r < PRELOAD_SLOTS; r++) {
            first_round[i][r] = load_row_unit(row_byte[r], u, up);
        }
    }
    first_round_pending = true;
}

// The first round: the preloaded rows, then the others loaded now.
void take_first_round(out Unit un[UNROLL][RG], uint row_byte[ROWS], uint u0, uint n_units, bool up) {
    for (uint i = 0u; i < UNROLL; i++) {
        uint u = unrolled_unit(u0, i, n_units);
        for (uint r = 0u; r < RG; r++) {
            if (r < PRELOAD_SLOTS) {
                un[i][r] = first_round[i][min(r, PRELOAD_SLOTS - 1u)];
            } else {
                un[i][r] = load_row_unit(row_byte[r], u, up);
            }
        }
    }
    first_round_pending = false;
}
#endif

// Zeroes acc.
void clear_acc() {
    for (uint r = 0u; r < ROWS; r++) {
        for (uint t = 0u; t < NT; t++) {
            acc[r][t] = 0.0;
        }
    }
}

// Adds the products of the loaded units un (units u0, u0 + WG, ... of rows
// rg .. rg + RG - 1) with tokens t0 .. t0 + NT - 1 to acc.
void add_units(Unit un[UNROLL][RG], uint rg, uint u0, uint n_units, uint t0) {
    for (uint i = 0u; i < UNROLL; i++) {
        uint u = u0 + i * WG;
        if (u >= n_units) {
            break;
        }
        for (uint run = 0u; run < RUNS; run++) {
            uvec4 codes[RG];
            float scale[RG];
            float offset[RG];
            for (uint r = 0u; r < RG; r++) {
                float minv;
                decode_codes(un[i][r], run, codes[r], scale[r], minv);
                offset[r] = minv - scale[r] * CODE_OFFSET;
            }
            // The run's 16 values: one uvec4 of quants, half a scale block.
            uint xv = run_x4(u, run) / 4u;
            for (uint t = 0u; t < NT; t++) {
                uvec4 q;
                float d;
                float s;
                x_run(t0 + t, xv, q, d, s);
                for (uint r = 0u; r < RG; r++) {
                    int idot = dot16(q, codes[r]);
                    acc[rg + r][t] += scale[r] * (d * int_float(idot)) + offset[r] * s;
                }
            }
        }
    }
}

// Sets acc to this invocation's sums of the rows at row_byte for tokens t0
// .. t0 + NT - 1 (invocation tid of WG strides over the row's units).
void sum_pass(uint row_byte[ROWS], uint t0, uint tid, bool up) {
    uint n_units = p.n_in / UNIT_VALUES;
    clear_acc();
    for (uint u0 = tid; u0 < n_units; u0 += UNROLL * WG) {
        for (uint rg = 0u; rg < ROWS; rg += RG) {
            // All loads of UNROLL units first, so that they are in flight together.
            Unit un[UNROLL][RG];
#if defined(NORM_PROLOGUE)
            if (PRELOAD && first_round_pending) {
                take_first_round(un, row_byte, u0, n_units, up);
            } else
#endif
            load_units(un, row_byte, rg, u0, n_units, up);
            add_units(un, rg, u0, n_units, t0);
        }
    }
}

#if defined(WAIT_X)
// Waits until word `at` of binding 4 has reached `want`; a wait that gives
// up sets the failure word. Invocation 0 polls with relaxed loads and
// acquires once (handoff.glsl), so the weight loads issued before the wait
// stay in flight through it. Every invocation must call it (barrier).
void wait_for_word(uint at, uint want) {
    if (gl_LocalInvocationID.x == 0u) {
        uint seen = 0u;
        for (uint spins = 0u; spins < X_SPINS; spins++) {
            seen = atomicLoad(qkv_arrivals[at], gl_ScopeDevice, gl_StorageSemanticsNone,
                gl_SemanticsRelaxed);
            if (seen >= want) {
                break;
            }
        }
        // Judged after the loop (see X_SPINS).
        if (seen < want) {
            wait_failed[p.split_part_off] = 1u;
        }
        handoff_acquire();
    }
    handoff_meet();
}

// Waits until p.split heads of the attention have counted themselves in
// at word p.split_count_off of binding 4, then (unless DIRECT_X) copies
// token 0 of the int8 copy (quants, scales, sums) into xq / xd / xs, where
// x_run reads it. Every invocation must call it (barriers).
void stage_waited_x() {
    wait_for_word(p.split_count_off, p.split);
    if (DIRECT_X) {
        return;
    }
    uint scales = 4u * int8_scales_vec4(0u, p.n_in);
    uint sums = 4u * int8_sums_vec4(0u, p.n_in);
    for (uint i = gl_LocalInvocationID.x; i < IN_VEC4; i += WG_ALL) {
        xq[i] = x_live4[i];
        xs[i] = x_live_f[sums + i];
        if (i < IN_VEC4 / 2u) {
            xd[i] = x_live_f[scales + i];
        }
    }
    barrier();
}

// sum_pass for one token with the invocation's first round of UNROLL
// units loaded before the wait (units past the row's end reload its last
// unit and are skipped), so those weights stream while the attention runs;
// where UNROLL * WG does not cover the row, the later rounds load after
// it. The units are summed in sum_pass's order (u = tid, tid + WG, ...)
// whatever UNROLL is, so the same bits. Every invocation must call it.
void sum_waited(uint row_byte[ROWS], uint tid) {
    uint n_units = p.n_in / UNIT_VALUES;
    clear_acc();
    if (p.parts != 0u) {
        wait_for_word(p.split_count_off + 1u, p.parts);
    }
    Unit un[UNROLL][RG];
    load_units(un, row_byte, 0u, min(tid, n_units - 1u), n_units, false);
    stage_waited_x();
    if (tid < n_units) {
        add_units(un, 0u, tid, n_units, 0u);
    }
    for (uint u0 = tid + UNROLL * WG; u0 < n_units; u0 += UNROLL * WG) {
        load_units(un, row_byte, 0u, u0, n_units, false);
        add_units(un, 0u, u0, n_units, 0u);
    }
}
#endif

#if defined(GATE_UP_EPILOGUE) || defined(SLICED)
// The plain kernel's reduction, per slice, first half: each subgroup's sum
// of every row and token into partial[slice]. A barrier must come between
// it and slice_sum.
void store_slice_partials(uint slice, uint sg_in_slice) {
    for (uint r = 0u; r < ROWS; r++) {
        for (uint t = 0u; t < NT; t++) {
            float s = subgroupAdd(acc[r][t]);
            if (subgroupElect()) {
                partial[slice][r * NT + t][sg_in_slice] = s;
            }
        }
    }
}

// Second half: the sum of row-and-token i (r * NT + t) of slice `slice`,
// its subgroups' partials in subgroup order.
float slice_sum(uint slice, uint i, uint sg_per_slice) {
    float s = 0.0;
    for (uint j = 0u; j < sg_per_slice; j++) {
        s += partial[slice][i][j];
    }
    return s;
}
#endif

#if defined(GATE_UP_INT8)
void main() {
    // Slice `slice` of the workgroup computes rows row0 + ROWS * (slice %
    // (SLICES / 2)) .. of gate (first half of the slices) or up.
    uint slice = gl_LocalInvocationID.x / WG;
    uint tid = gl_LocalInvocationID.x % WG;
    bool up = slice >= SLICES / 2u;
    uint block_row0 = workgroup_index() * BLOCK_ROWS;
    uint row0 = block_row0 + ROWS * (slice % (SLICES / 2u));
    uint row_byte[ROWS];
    for (uint r = 0u; r < ROWS; r++) {
        row_byte[r] = min(row0 + r, p.n_rows - 1u) * p.row_stride;
    }
    // Subgroups of a slice (a slice is whole subgroups: WG is a multiple
    // of the subgroup size).
    uint sg_per_slice = WG / gl_SubgroupSize;
    uint sg_in_slice = gl_SubgroupID % sg_per_slice;
#if defined(NORM_PROLOGUE)
    touch_first_round(row_byte, tid, up);
    preload_first_round(row_byte, tid, up);
    load_x_normed();
#endif
    for (uint t0 = 0u; t0 < p.n_tok; t0 += NT) {
        sum_pass(row_byte, t0, tid, up);
        // The plain kernel's reduction, per slice: subgroup sums, then
        // their partials in subgroup order.
        store_slice_partials(slice, sg_in_slice);
        barrier();
        for (uint i = tid; i < ROWS * NT; i += WG) {
            block_sums[slice * ROWS + i / NT][i % NT] = slice_sum(slice, i, sg_per_slice);
        }
        barrier();
        // Eight invocations per token quantise its block, four values each
        // (store_int8_part, as span_act.comp): gate row k of the block is
        // block_sums[k], its up row block_sums[BLOCK_ROWS + k].
        uint lid = gl_LocalInvocationID.x;
        uint t = lid / 8u;
        uint part = lid % 8u;
        bool write = t < NT && t0 + t < p.n_tok;
        vec4 v = vec4(0.0);
        if (write) {
            for (uint c = 0u; c < 4u; c++) {
                uint k = 4u * part + c;
                v[c] = gated_act(block_sums[k][t], GELU) * block_sums[BLOCK_ROWS + k][t];
            }
        }
        // The copy's rows are tokens of y_stride (n_ff) values; this
        // chunk's rows start at y_offset.
        store_int8_part(v, write, t0 + t, (p.y_offset + block_row0) / BLOCK_ROWS, p.y_stride);
        barrier();
    }
}
#elif defined(GATE_UP_NARROW)
// Float offset in the binding-4 scratch of act(gate) * up of row `row` of
// token t: past the arrival counters (one per block, whole vec4s).
uint act_at(uint t, uint row) {
    uint counters = (p.y_stride / BLOCK_ROWS + 3u) & ~3u;
    return counters + t * p.y_stride + row;
}

void main() {
    // Rows row0 .. row0 + OUT_ROWS - 1 of gate (sums acc[0 ..]) and of up
    // (acc[OUT_ROWS ..]); in the int8 copy, rows from out_row0 (y_offset:
    // the chunk's first row) in block blk.
    uint tid = gl_LocalInvocationID.x;
    uint row0 = workgroup_index() * OUT_ROWS;
    uint row_byte[ROWS];
    for (uint r = 0u; r < ROWS; r++) {
        row_byte[r] = min(row0 + r % OUT_ROWS, p.n_rows - 1u) * p.row_stride;
    }
    uint sg_per_slice = WG / gl_SubgroupSize;
    uint out_row0 = p.y_offset + row0;
    uint blk = out_row0 / BLOCK_ROWS;
    for (uint t0 = 0u; t0 < p.n_tok; t0 += NT) {
        sum_pass(row_byte, t0, tid, false);
        // The plain kernel's reduction, then the GATE_UP_INT8 epilogue's
        // product, per row and token.
        store_slice_partials(0u, gl_SubgroupID);
        barrier();
        for (uint i = tid; i < OUT_ROWS * NT; i += WG) {
            uint r = i / NT;
            uint t = i % NT;
            if (t0 + t < p.n_tok) {
                float gate = slice_sum(0u, r * NT + t, sg_per_slice);
                float up = slice_sum(0u, (OUT_ROWS + r) * NT + t, sg_per_slice);
                act_scratch[act_at(t0 + t, out_row0 + r)] = gated_act(gate, GELU) * up;
            }
        }
        barrier();
    }
    // Count this workgroup in; the last of the block's to arrive quantises
    // it for every token. (handoff.glsl: invocation 0's count is the
    // release of the workgroup's products and, for the last to arrive, the
    // acquire of the others'.)
    handoff_meet();
    if (tid == 0u) {
        uint arrived = atomicAdd(arrivals[blk], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer,
            gl_SemanticsAcquireRelease);
        last_here = arrived + 1u == BLOCK_ROWS / OUT_ROWS ? 1u : 0u;
    }
    handoff_meet();
    if (last_here == 0u) {
        return;
    }
    if (tid == 0u) {
        arrivals[blk] = 0u;
    }
    // Eight invocations per token, four values each (store_int8_part, as
    // span_act.comp and the GATE_UP_INT8 epilogue).
    for (uint t0 = 0u; t0 < p.n_tok; t0 += WG / 8u) {
        uint t = t0 + tid / 8u;
        uint part = tid % 8u;
        bool write = t < p.n_tok;
        vec4 v = vec4(0.0);
        if (write) {
            for (uint c = 0u; c < 4u; c++) {
                v[c] = act_scratch[act_at(t, BLOCK_ROWS * blk + 4u * part + c)];
            }
        }
        store_int8_part(v, write, t, blk, p.y_stride);
    }
}
#elif defined(SLICED)
// Counts the workgroup's stored rows in at the arrival word of each KV head
// they belong to (one token; p.split rows a head). Every invocation must
// call it.
void count_qkv_rows() {
    handoff_meet();
    uint wg_rows = SLICES * ROWS;
    uint first = workgroup_index() * wg_rows;
    if (gl_LocalInvocationID.x == 0u && first < p.n_rows) {
        handoff_release();
        uint r0 = p.y_offset - p.split_part_off + first;
        uint r1 = r0 + min(wg_rows, p.n_rows - first) - 1u;
        for (uint g = r0 / p.split; g <= r1 / p.split; g++) {
            uint lo = max(r0, g * p.split);
            uint hi = min(r1, g * p.split + p.split - 1u);
            atomicAdd(qkv_arrivals[p.split_count_off + 2u * g], hi - lo + 1u);
        }
    }
}

void main() {
    // Slice `slice` computes rows row0 .. row0 + ROWS - 1 of one token.
    uint slice = gl_LocalInvocationID.x / WG;
    uint tid = gl_LocalInvocationID.x % WG;
    uint row0 = (workgroup_index() * SLICES + slice) * ROWS;
    uint row_byte[ROWS];
    for (uint r = 0u; r < ROWS; r++) {
        // Rows past the end read the last row; their sums are never written.
        row_byte[r] = min(row0 + r, p.n_rows - 1u) * p.row_stride;
    }
    uint sg_per_slice = WG / gl_SubgroupSize;
    uint sg_in_slice = gl_SubgroupID % sg_per_slice;
#if defined(WAIT_X)
    // One token: invocation tid < ROWS stores row row0 + tid, adding it to
    // the residual's value read now, before the wait.
    uint at = p.y_offset + row0 + tid;
    bool stores = tid < ROWS && row0 + tid < p.n_rows;
    float y_old = stores && p.accumulate != 0u ? y[at] : 0.0;
    sum_waited(row_byte, tid);
    store_slice_partials(slice, sg_in_slice);
    barrier();
    if (stores) {
        float v = slice_sum(slice, tid, sg_per_slice);
        y[at] = p.accumulate != 0u ? y_old + v : v;
    }
#else
    touch_first_round(row_byte, tid, false);
    preload_first_round(row_byte, tid, false);
    load_x_normed();
    sum_pass(row_byte, 0u, tid, false);
    // The plain kernel's reduction (store_sums), per slice.
    store_slice_partials(slice, sg_in_slice);
    barrier();
    for (uint i = tid; i < ROWS * NT; i += WG) {
        uint r = i / NT;
        uint t = i % NT;
        if (row0 + r < p.n_rows && t < p.n_tok) {
            uint at = t * p.y_stride + p.y_offset + row0 + r;
            float v = slice_sum(slice, i, sg_per_slice);
            if (p.split_count_off != 0u) {
                y_live[at] = v;
            } else {
                store_y(at, v);
            }
        }
    }
    if (p.split_count_off != 0u) {
        count_qkv_rows();
    }
#endif
}
#else
void main() {
    uint row0 = workgroup_index() * ROWS;
    // Uniform across the workgroup, so the barriers below stay legal.
    if (row0 >= p.n_rows) {
        return;
    }
    uint tid = gl_LocalInvocationID.x;
    uint row_byte[ROWS];
    for (uint r = 0u; r < ROWS; r++) {
        // Rows past the end read the last row; their sums are never written.
        row_byte[r] = min(row0 + r, p.n_rows - 1u) * p.row_stride;
    }

    for (uint t0 = 0u; t0 < p.n_tok; t0 += NT) {
        load_x(t0);
#if !defined(X_PREQUANTISED)
        barrier();
#endif
        sum_pass(row_byte, t0, tid, false);
        store_sums(row0, t0);
    }
}
#endif
