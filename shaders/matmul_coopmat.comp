#version 450
// Tiled matrix-matrix product on cooperative matrices (prefill): f16 weight
// and input tiles staged in shared memory, f32 accumulation on the device's
// matrix units (VK_KHR_cooperative_matrix).
//
// A workgroup computes a BM x BN block of y (rows x tokens) with
// WARPS_M x WARPS_N subgroups; each subgroup owns FM x FN accumulator
// fragments of TM x TN. Per step of BK values (a multiple of 32) the weight
// rows are decoded (dequant.glsl) and the input tokens converted to f16, both
// stored row by row (BK / 2 dwords) with a row stride of STRIDE dwords; values
// past the end of a row (n_in is a multiple of 32 only) are zero. The
// host computes STRIDE with one function (tile_padding.rs) that also checks
// the shared-memory budget; the padding spreads the fragment loads over the
// memory banks.
//
// The tiles are uvec4 arrays and every row starts on a 16-byte boundary
// (STRIDE is a multiple of 4 dwords): each 8-value group is one 16-byte
// store and the fragment loads index whole 16-byte elements (measured on
// the H200 against 4-byte elements: no change end to end).
//
// With PIPELINE = 1 the staging is software-pipelined over two halves of
// double-buffered A/B tiles: step s issues the global loads of step s + 1
// into registers (raw weight words, coopmat_raw.glsl, and x values), runs
// its own fragment products from the half staged before, then decodes the
// registers into the other half; one barrier per step separates the halves'
// writers from their readers. The staged values and the order of the
// products are those of PIPELINE = 0, so the results are the same bits.
// PIPELINE = 2 issues the loads two steps ahead instead of one (two register
// sets, the step loop unrolled by two so that each set is named by a
// literal): a step's loads then have two steps' products and stores to
// arrive, which matters where steps are short (few tokens per tile, batched
// decode). Same tiles, same products, same bits.
//
// Q4_K, Q5_K and Q6_K weights are staged in step runs (coopmat_step_runs.glsl):
// RUN_VALUES consecutive values of a row per unit instead of 8-value
// groups, the longest run (32, 16 or 8 values) that still leaves every
// invocation a unit of the A tile per step. A run loads its block head once
// and its quant bytes in 16-byte words and decodes the sub-block's scale
// once; the staged values are the groups' bits.
//
// Bindings and push constants are those of the other matmul kernels
// (common.glsl), so a dispatch can swap matmul_tiled for this one.
//
// With WARPS_K > 1 the workgroup's subgroups also split each step along
// n_in: WARPS_K groups of WARPS_M x WARPS_N subgroups stage the step
// together and each group multiplies its BK / WARPS_K values into its own
// accumulators, which are summed in group order through shared memory at
// the end. Batched decode (16 tokens per tile) needs this: a tile of few
// rows and tokens then still has enough subgroups to stage each step and
// hide its loads (on the H200 a 32 x 16 tile of 8 subgroups beat a 64 x 16
// tile of 4 by half).
//
// With p.split > 1 (the batch tile's small dispatches, split_k.rs) the
// steps are also divided among p.split workgroups per output tile, which
// are consecutive along y: each multiplies its share into a partial tile in
// the scratch at binding 3 and counts itself in with an atomic; the last to
// arrive sums the partials in split order, writes y and resets the counter.
//
// With X_F16 defined, x arrives in f16 (8 values per 16-byte word, token t
// from half t * n_in; the span's norm writes it so before prefill matmuls):
// half the input bytes, and no conversion when staging the B tile. The
// staged values are the f16 roundings the f32 path makes, so the products
// are the same.
//
// With EMULATE_COOPMAT defined, the fragment operations are plain code over
// the same shared tiles (logical subgroups of 32 invocations, 16x16x16
// fragments). That variant needs no matrix units, so the tiling, staging,
// padding and output paths run and are tested on any device; it is slow.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable
#if !defined(EMULATE_COOPMAT)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif

// Specialisation constants, in the order coopmat.rs passes them.
layout(constant_id = 0) const uint STRIDE = 20u;
layout(constant_id = 1) const uint TM = 16u;
layout(constant_id = 2) const uint TN = 16u;
layout(constant_id = 3) const uint TK = 16u;
layout(constant_id = 4) const uint WARPS_M = 2u;
layout(constant_id = 5) const uint WARPS_N = 2u;
layout(constant_id = 6) const uint FM = 4u;
layout(constant_id = 7) const uint FN = 4u;
// Invocations per subgroup (32 in the emulation).
layout(constant_id = 8) const uint LANES = 32u;
// WARPS_M * WARPS_N * WARPS_K * LANES.
layout(local_size_x_id = 9) in;
// Values per staging step.
layout(constant_id = 10) const uint BK = 32u;
// 0: stage each step, then multiply (one tile); 1: pipelined (two tiles);
// 2: pipelined with the loads two steps ahead.
layout(constant_id = 11) const uint PIPELINE = 0u;
// Subgroup groups splitting each step along n_in (BK / WARPS_K values each).
layout(constant_id = 12) const uint WARPS_K = 1u;
// 1: K-quant weight fetches as 16- and 8-byte loads (coopmat_raw.glsl).
layout(constant_id = 13) const uint WIDE_FETCH = 1u;

#include "common.glsl"
#include "dequant.glsl"
#include "coopmat_raw.glsl"
#if defined(X_F16)
layout(std430, binding = 1) readonly buffer XH { uvec4 x_h[]; };
#endif

// Most fragments per subgroup along rows and along tokens (coopmat.rs
// refuses tiles with more, MAX_FRAGS_PER_SIDE).
#define MAX_FRAGS 4u

const uint BM = WARPS_M * FM * TM;
const uint BN = WARPS_N * FN * TN;
const uint WARPS_MN = WARPS_M * WARPS_N;
const uint THREADS = WARPS_MN * WARPS_K * LANES;
// Values of a step each group of subgroups multiplies.
const uint K_SLICE = BK / WARPS_K;

// Staged tiles: one, or two halves when pipelined (the host's budget check
// counts the same).
const uint STAGES = PIPELINE == 0u ? 1u : 2u;
const uint A_TILE = BM * STRIDE;
const uint B_TILE = BN * STRIDE;
// Row r of a tile: values 2j, 2j+1 of the step in dword r * STRIDE + j,
// i.e. component j % 4 of element (r * STRIDE + j) / 4.
shared uvec4 buf_a[STAGES * A_TILE / 4u];
shared uvec4 buf_b[STAGES * B_TILE / 4u];
// One TM x TN fragment per subgroup on its way out, column-major.
shared float buf_c[WARPS_MN * WARPS_K * TM * TN];

// This workgroup's token tile and split, from y (main sets them).
uint tile_y;
uint split_z;

#define A_STRIDE STRIDE
#define B_STRIDE STRIDE
#include "coopmat_frag.glsl"

// The A tile's staging units: 8-value groups, or step runs of RUN_VALUES.
#if defined(TYPE_Q4_K) || defined(TYPE_Q5_K) || defined(TYPE_Q6_K)
#define STEP_RUNS
const uint RUN_VALUES = BM * (BK / 32u) >= THREADS ? 32u : (BM * (BK / 16u) >= THREADS ? 16u : 8u);
#include "coopmat_step_runs.glsl"
const uint UNIT_GROUPS = RUN_VALUES / 8u;
#else
const uint UNIT_GROUPS = 1u;
#endif
// Units per row and step, and in the tile.
const uint ROW_UNITS = BK / 8u / UNIT_GROUPS;
const uint A_UNITS = BM * ROW_UNITS;

// Zeros for the groups kg0 .. kg0 + UNIT_GROUPS - 1 of row r (past the row's end).
void put_a_zero(uint a_base, uint r, uint kg0) {
    [[unroll]] for (uint i = 0u; i < UNIT_GROUPS; i++) {
        put_a(a_base, r, kg0 + i, vec4(0.0), vec4(0.0));
    }
}

// PIPELINE = 0: loads, decodes and stores the step at k0 into the one tile.
void stage_step(uint k0) {
    // Weight tile: BM rows x ROW_UNITS units of UNIT_GROUPS groups of 8 values.
    for (uint task = gl_LocalInvocationIndex; task < A_UNITS; task += THREADS) {
        uint r = task / ROW_UNITS;
        uint kg0 = (task % ROW_UNITS) * UNIT_GROUPS;
        if (k0 + kg0 * 8u >= p.n_in) {
            put_a_zero(0u, r, kg0);
            continue;
        }
#if defined(STEP_RUNS)
        StepRun run;
        run = step_run_fetch(tile_row_byte(r), k0 / 8u + kg0, run, false);
        step_run_put(run, k0 / 8u + kg0, 0u, r, kg0);
#else
        vec4 lo;
        vec4 hi;
        dequant_group(tile_row_byte(r), k0 / 8u + kg0, lo, hi);
        put_a(0u, r, kg0, lo, hi);
#endif
    }
    // Input tile: BN tokens x BK / 8 groups of 8; tokens past the end are zero.
    for (uint task = gl_LocalInvocationIndex; task < BN * (BK / 8u); task += THREADS) {
        uint n = task / (BK / 8u);
        uint kg = task % (BK / 8u);
#if defined(X_F16)
        put_b_f16(0u, n, kg, input_halves(k0, n, kg));
#else
        put_b(0u, n, kg, input_vec4(k0, n, 2u * kg), input_vec4(k0, n, 2u * kg + 1u));
#endif
    }
}

// PIPELINE >= 1: the tasks of one step per invocation and their registers,
// one set per step in flight (set 1 only with PIPELINE = 2). Callers name
// the set by a literal, so after inlining each access is to one array.
const uint A_TASKS = (A_UNITS + THREADS - 1u) / THREADS;
const uint B_TASKS = (BN * (BK / 8u) + THREADS - 1u) / THREADS;
const uint SETS = PIPELINE == 2u ? 2u : 1u;
#if defined(STEP_RUNS)
StepRun raw_a[SETS][A_TASKS];
#else
RawGroup raw_a[SETS][A_TASKS];
#endif
#if defined(X_F16)
uvec4 raw_b[SETS][B_TASKS];
#else
vec4 raw_b_lo[SETS][B_TASKS];
vec4 raw_b_hi[SETS][B_TASKS];
#endif

// Step runs may take words from the step before only where that step was
// fetched into the same registers just before (coopmat_step_runs.glsl).
const bool RUNS_FOLLOW = SETS == 1u && BK == 32u;

// Issues the global loads of the step at k0 into register set `set`;
// `follows`: the set holds the step before's (k0 - BK) weights.
void fetch_step(uint k0, uint set, bool follows) {
    [[unroll]] for (uint t = 0u; t < A_TASKS; t++) {
        uint task = gl_LocalInvocationIndex + t * THREADS;
        uint r = task / ROW_UNITS;
        uint kg0 = (task % ROW_UNITS) * UNIT_GROUPS;
        if (task < A_UNITS && k0 + kg0 * 8u < p.n_in) {
#if defined(STEP_RUNS)
            raw_a[set][t] = step_run_fetch(tile_row_byte(r), k0 / 8u + kg0, raw_a[set][t], follows && RUNS_FOLLOW);
#else
            raw_a[set][t] = raw_fetch(tile_row_byte(r), k0 / 8u + kg0);
#endif
        }
    }
    [[unroll]] for (uint t = 0u; t < B_TASKS; t++) {
        uint task = gl_LocalInvocationIndex + t * THREADS;
        if (task < BN * (BK / 8u)) {
            uint n = task / (BK / 8u);
            uint kg = task % (BK / 8u);
#if defined(X_F16)
            raw_b[set][t] = input_halves(k0, n, kg);
#else
            raw_b_lo[set][t] = input_vec4(k0, n, 2u * kg);
            raw_b_hi[set][t] = input_vec4(k0, n, 2u * kg + 1u);
#endif
        }
    }
}

// Decodes register set `set`, fetched for the step at k0, into tile half `stage`.
void store_step(uint k0, uint stage, uint set) {
    [[unroll]] for (uint t = 0u; t < A_TASKS; t++) {
        uint task = gl_LocalInvocationIndex + t * THREADS;
        uint r = task / ROW_UNITS;
        uint kg0 = (task % ROW_UNITS) * UNIT_GROUPS;
        if (task < A_UNITS) {
            if (k0 + kg0 * 8u >= p.n_in) {
                put_a_zero(stage * A_TILE, r, kg0);
            } else {
#if defined(STEP_RUNS)
                step_run_put(raw_a[set][t], k0 / 8u + kg0, stage * A_TILE, r, kg0);
#else
                vec4 lo;
                vec4 hi;
                raw_decode(raw_a[set][t], k0 / 8u + kg0, lo, hi);
                put_a(stage * A_TILE, r, kg0, lo, hi);
#endif
            }
        }
    }
    [[unroll]] for (uint t = 0u; t < B_TASKS; t++) {
        uint task = gl_LocalInvocationIndex + t * THREADS;
        if (task < BN * (BK / 8u)) {
#if defined(X_F16)
            put_b_f16(stage * B_TILE, task / (BK / 8u), task % (BK / 8u), raw_b[set][t]);
#else
            put_b(stage * B_TILE, task / (BK / 8u), task % (BK / 8u), raw_b_lo[set][t], raw_b_hi[set][t]);
#endif
        }
    }
}

#include "coopmat_output.glsl"

// write_fragment for WARPS_K > 1: every subgroup stores its partial
// fragment f, then the first group's subgroups sum the groups' partials in
// group order and write them. Every invocation must call it (barriers).
void write_split_fragment(Acc c, uint f, uint warp, uint lane, uint warp_m, uint warp_n) {
    uint fm = f / FN;
    uint fn = f % FN;
    uint row0 = gl_WorkGroupID.x * BM + (warp_m * FM + fm) * TM;
    uint tok0 = tile_y * BN + (warp_n * FN + fn) * TN;
    STORE_C(c, warp * TM * TN);
    barrier();
    if (warp < WARPS_MN) {
        for (uint e = lane; e < TM * TN; e += LANES) {
            uint row = row0 + e % TM;
            uint tok = tok0 + e / TM;
            float s = 0.0;
            for (uint g = 0u; g < WARPS_K; g++) {
                s += buf_c[(g * WARPS_MN + warp) * TM * TN + e];
            }
            if (row < p.n_rows && tok < p.n_tok) {
                emit(row, tok, s);
            }
        }
    }
    barrier();
}

// The fragment products of the step staged in tile half `cur` (a macro:
// it accumulates into main's acc array, which must stay in registers).
#define MULTIPLY_STEP(cur) { \
        uint a_base_ = (cur) * A_TILE; \
        uint b_base_ = (cur) * B_TILE; \
        [[unroll]] for (uint j = 0u; j < K_SLICE; j += TK) { \
            uint kk = warp_k * K_SLICE + j; \
            FRAG_A a[MAX_FRAGS]; \
            FRAG_B b[MAX_FRAGS]; \
            [[unroll]] for (uint fm = 0u; fm < FM; fm++) { \
                LOAD_A(a[fm], a_base_ + ((warp_m * FM + fm) * TM) * STRIDE + kk / 2u); \
            } \
            [[unroll]] for (uint fn = 0u; fn < FN; fn++) { \
                LOAD_B(b[fn], b_base_ + ((warp_n * FN + fn) * TN) * STRIDE + kk / 2u); \
            } \
            [[unroll]] for (uint fm = 0u; fm < FM; fm++) { \
                [[unroll]] for (uint fn = 0u; fn < FN; fn++) { \
                    MUL_ADD(acc[fm * FN + fn], a[fm], b[fn]); \
                } \
            } \
        } \
    }

void main() {
    uint warp = WARP_ID;
    uint lane = LANE_ID;
    uint warp_mn = warp % WARPS_MN;
    uint warp_k = warp / WARPS_MN;
    uint warp_m = warp_mn % WARPS_M;
    uint warp_n = warp_mn / WARPS_M;
    uint ways = max(p.split, 1u);
    tile_y = gl_WorkGroupID.y / ways;
    split_z = gl_WorkGroupID.y % ways;

    // The accumulators must stay in registers. Every loop over them has a
    // plain body and is unrolled, and the output names each fragment by a
    // literal index (WRITE_FRAGMENT below, hence arrays sized by MAX_FRAGS):
    // when the output looped over acc, the H200's driver left that loop
    // rolled and put the whole array in local memory (pipeline statistics:
    // FM * FN * 32 bytes), and prefill ran 2.2x slower.
    Acc acc[MAX_FRAGS * MAX_FRAGS];
    [[unroll]] for (uint f = 0u; f < FM * FN; f++) {
        ACC_ZERO(acc[f]);
    }

    // This workgroup's steps: all, or its split's consecutive share (the
    // last share may be short or empty; an empty one adds zeros).
    uint all_steps = (p.n_in + BK - 1u) / BK;
    uint share = (all_steps + ways - 1u) / ways;
    uint first_step = min(split_z * share, all_steps);
    uint n_steps = min(share, all_steps - first_step);
    uint k_base = first_step * BK;
    if (PIPELINE != 0u && n_steps > 0u) {
        fetch_step(k_base, 0u, false);
        store_step(k_base, 0u, 0u);
        barrier();
    }
    if (PIPELINE == 2u) {
        // Step 1 in flight in set 1; each step below fetches two ahead.
        if (n_steps > 1u) {
            fetch_step(k_base + BK, 1u, false);
        }
        for (uint s = 0u; s < n_steps; s += 2u) {
            // Even step: tile half 0; set 0 is free (its step was staged
            // last step), set 1 holds step s + 1.
            if (s + 2u < n_steps) {
                fetch_step(k_base + (s + 2u) * BK, 0u, false);
            }
            MULTIPLY_STEP(0u);
            if (s + 1u < n_steps) {
                store_step(k_base + (s + 1u) * BK, 1u, 1u);
            }
            barrier();
            if (s + 1u < n_steps) {
                // Odd step: tile half 1; set 1 is free, set 0 holds s + 2.
                if (s + 3u < n_steps) {
                    fetch_step(k_base + (s + 3u) * BK, 1u, false);
                }
                MULTIPLY_STEP(1u);
                if (s + 2u < n_steps) {
                    store_step(k_base + (s + 2u) * BK, 0u, 0u);
                }
                barrier();
            }
        }
    } else {
        for (uint s = 0u; s < n_steps; s++) {
            uint k0 = k_base + s * BK;
            bool has_next = s + 1u < n_steps;
            uint cur = 0u;
            if (PIPELINE == 0u) {
                stage_step(k0);
                barrier();
            } else {
                // Half `cur` was staged (and fenced) during the step before.
                cur = s & 1u;
                if (has_next) {
                    fetch_step(k0 + BK, 0u, true);
                }
            }
            MULTIPLY_STEP(cur);
            // The other half was last read in the step before, behind the
            // previous barrier; this barrier publishes it to the next step and
            // keeps this step's readers of `cur` ahead of its next writers.
            if (PIPELINE != 0u && has_next) {
                store_step(k0 + BK, cur ^ 1u, 0u);
            }
            barrier();
        }
    }

    // Each fragment goes out through the subgroup's slot of buf_c, so that
    // partial tiles are cut at the matrix edges and the writes are coalesced.
    // The fragments are named by literal indices: a loop over them would be
    // one the driver may leave rolled (its body holds barriers and a loop),
    // and one dynamic index puts the whole accumulator array in local memory.
    uint c_base = warp * TM * TN;
#define WRITE_FRAGMENT(f) if ((f) < FM * FN) { \
        if (WARPS_K == 1u) { write_fragment(acc[f], f, c_base, lane, warp_m, warp_n); } \
        else { write_split_fragment(acc[f], f, warp, lane, warp_m, warp_n); } }
    WRITE_FRAGMENT(0u) WRITE_FRAGMENT(1u) WRITE_FRAGMENT(2u) WRITE_FRAGMENT(3u)
    WRITE_FRAGMENT(4u) WRITE_FRAGMENT(5u) WRITE_FRAGMENT(6u) WRITE_FRAGMENT(7u)
    WRITE_FRAGMENT(8u) WRITE_FRAGMENT(9u) WRITE_FRAGMENT(10u) WRITE_FRAGMENT(11u)
    WRITE_FRAGMENT(12u) WRITE_FRAGMENT(13u) WRITE_FRAGMENT(14u) WRITE_FRAGMENT(15u)
    if (p.split > 1u) {
        finish_split();
    }
}
