#version 450
// Cooperative-matrix matmul for a few tokens (batched decode) that streams
// the weights like a matvec: every subgroup stages and multiplies its own
// FM x TM rows, so the weight staging needs no workgroup barrier.
//
// The batch tile of matmul_coopmat.comp stages each step of BK values for
// the whole workgroup and fences it with a workgroup barrier; with 8-16
// tokens a step is little work, and on the H200 that tile moved ~0.5 TB/s
// of weights. Here the workgroup stages only x, in chunks of X_CHUNK values
// for all its BN = FN x TN tokens (one barrier pair per chunk), while each
// subgroup walks its rows in steps of BK values: it decodes a step's
// weights from registers into its own half of a double-buffered A tile,
// issues the global loads of the step two on into the registers just
// freed, crosses a subgroup barrier and multiplies the step against the
// chunk. The A tile's rows of one subgroup are read only by that subgroup.
// The weights are fetched in runs of 32 values (coopmat_runs.glsl), the
// lanes of one load on consecutive runs (lanes spread over 16 rows per load
// ran at 60% of the speed). On the H200 this moves 12-22% more bytes per
// call than the workgroup-staged tile, still a third of the one-token
// matvec (docs/BENCHMARKS.md), so it is opt-in.
//
// The products run in the order of matmul_coopmat.comp with WARPS_K = 1
// (the 16-deep slices of every step in increasing order into one
// accumulator per fragment), and the staged f16 values are the same, so a
// tile of the same shape and step gives the same bits under every staging.
//
// Bindings, push constants, the cross-workgroup split of the steps
// (p.split, coopmat_output.glsl) and the emulation (EMULATE_COOPMAT,
// coopmat_frag.glsl) are those of matmul_coopmat.comp.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable
#if !defined(EMULATE_COOPMAT)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif

// Specialisation constants, in the order coopmat.rs passes them (the same
// ids as matmul_coopmat.comp; WARPS_N and WARPS_K are 1 for this kernel).
layout(constant_id = 0) const uint STRIDE = 36u;
layout(constant_id = 1) const uint TM = 16u;
layout(constant_id = 2) const uint TN = 16u;
layout(constant_id = 3) const uint TK = 16u;
layout(constant_id = 4) const uint WARPS_M = 4u;
layout(constant_id = 5) const uint WARPS_N = 1u;
layout(constant_id = 6) const uint FM = 1u;
layout(constant_id = 7) const uint FN = 1u;
layout(constant_id = 8) const uint LANES = 32u;
// WARPS_M * LANES.
layout(local_size_x_id = 9) in;
// Values per subgroup step.
layout(constant_id = 10) const uint BK = 64u;
layout(constant_id = 11) const uint PIPELINE = 3u;
layout(constant_id = 12) const uint WARPS_K = 1u;
layout(constant_id = 13) const uint WIDE_FETCH = 0u;
// Values of x staged at once (a multiple of BK), and the dword stride of a
// staged token row of them (tile_padding.rs).
layout(constant_id = 14) const uint X_CHUNK = 256u;
layout(constant_id = 15) const uint X_STRIDE = 132u;
// Steps whose weight loads are in flight at once: one register set per
// step ahead. (Four measured slower than two on the H200: the extra sets
// cost more occupancy than the loads in flight gained.)
const uint AHEAD = 2u;

#include "common.glsl"
#include "dequant.glsl"
#include "coopmat_raw.glsl"
#include "coopmat_runs.glsl"

#define MAX_FRAGS 4u

const uint BM = WARPS_M * FM * TM;
const uint BN = FN * TN;
const uint THREADS = WARPS_M * LANES;
// The A tile: two halves of BM rows of BK values; subgroup w owns rows
// w * FM * TM .. + FM * TM of both.
const uint A_HALF = BM * STRIDE;
shared uvec4 buf_a[2u * A_HALF / 4u];
// The x chunk: BN token rows of X_CHUNK values.
shared uvec4 buf_b[BN * X_STRIDE / 4u];
// One TM x TN fragment per subgroup on its way out, column-major.
shared float buf_c[WARPS_M * TM * TN];

uint tile_y;
uint split_z;

#define A_STRIDE STRIDE
#define B_STRIDE X_STRIDE
#include "coopmat_frag.glsl"
#include "coopmat_output.glsl"

// A subgroup's share of a step: FM * TM rows x BK / 32 runs of 32 values
// (coopmat_runs.glsl), TASKS_PER_LANE per lane; the lanes of one load take
// consecutive runs (whole rows' stretches), so each load instruction
// touches few rows.
const uint RUNS_PER_ROW = BK / 32u;
const uint TASKS = FM * TM * RUNS_PER_ROW;
const uint TASKS_PER_LANE = (TASKS + LANES - 1u) / LANES;
// AHEAD register sets of raw weight runs: the steps ahead.
RawRun raw_a[AHEAD][TASKS_PER_LANE];

uint lane;
// This subgroup's first row in the tile.
uint sub_row0;

// Issues the global loads of this subgroup's rows of the step at k0 into
// register set `set` (callers pass a literal). n_in is a multiple of 32, so
// a run lies wholly inside or past the row, and value k0 + 32 kr is inside
// exactly when run kr is (a K-quant run's chunk starts at k0 + 64 (kr / 2),
// and K-quant rows are multiples of 256 values).
void fetch_rows(uint k0, uint set) {
    [[unroll]] for (uint t = 0u; t < TASKS_PER_LANE; t++) {
        uint task = t * LANES + lane;
        uint r = task / RUNS_PER_ROW;
        uint kr = task % RUNS_PER_ROW;
        if (task < TASKS && k0 + kr * 32u < p.n_in) {
            raw_a[set][t] = run_fetch(tile_row_byte(sub_row0 + r), k0 / 8u + RUN_GROUP(kr, 0u));
        }
    }
}

// Decodes register set `set`, fetched for the step at k0, into A half `set`.
void store_rows(uint k0, uint set) {
    [[unroll]] for (uint t = 0u; t < TASKS_PER_LANE; t++) {
        uint task = t * LANES + lane;
        uint r = task / RUNS_PER_ROW;
        uint kr = task % RUNS_PER_ROW;
        if (task < TASKS) {
            bool inside = k0 + kr * 32u < p.n_in;
            [[unroll]] for (uint i = 0u; i < 4u; i++) {
                vec4 lo = vec4(0.0);
                vec4 hi = vec4(0.0);
                if (inside) {
                    raw_decode(run_group(raw_a[set][t], i), k0 / 8u + RUN_GROUP(kr, i), lo, hi);
                }
                put_a(set * A_HALF, sub_row0 + r, RUN_GROUP(kr, i), lo, hi);
            }
        }
    }
}

// Stages x values k0 .. k0 + X_CHUNK of the tile's tokens as f16 (zero past
// the row's end and the last token). The whole workgroup calls it.
void stage_x(uint k0) {
    for (uint task = gl_LocalInvocationIndex; task < BN * (X_CHUNK / 8u); task += THREADS) {
        uint n = task / (X_CHUNK / 8u);
        uint kg = task % (X_CHUNK / 8u);
        put_b(0u, n, kg, input_vec4(k0, n, 2u * kg), input_vec4(k0, n, 2u * kg + 1u));
    }
}

// The fragment products of the step in A half `half_` against x chunk
// values x_off .. x_off + BK (a macro: it accumulates into main's acc
// array, which must stay in registers).
#define MULTIPLY_STEP(half_, x_off) { \
        [[unroll]] for (uint j = 0u; j < BK; j += TK) { \
            FRAG_A a[MAX_FRAGS]; \
            FRAG_B b[MAX_FRAGS]; \
            [[unroll]] for (uint fm = 0u; fm < FM; fm++) { \
                LOAD_A(a[fm], (half_) * A_HALF + (sub_row0 + fm * TM) * STRIDE + j / 2u); \
            } \
            [[unroll]] for (uint fn = 0u; fn < FN; fn++) { \
                LOAD_B(b[fn], fn * TN * X_STRIDE + ((x_off) + j) / 2u); \
            } \
            [[unroll]] for (uint fm = 0u; fm < FM; fm++) { \
                [[unroll]] for (uint fn = 0u; fn < FN; fn++) { \
                    MUL_ADD(acc[fm * FN + fn], a[fm], b[fn]); \
                } \
            } \
        } \
    }

// Step s of this workgroup's share, its weights in register set `set` =
// s % 2 (a literal): restage x at a chunk's first step, decode the weights
// into A half `set`, refill the set with step s + AHEAD, multiply.
#define RUN_STEP(s_, set) { \
        uint s = (s_); \
        uint x_off = (s * BK) % X_CHUNK; \
        if (x_off == 0u) { \
            barrier(); \
            stage_x(k_base + s * BK); \
            barrier(); \
        } \
        store_rows(k_base + s * BK, set); \
        if (s + AHEAD < n_steps) { \
            fetch_rows(k_base + (s + AHEAD) * BK, set); \
        } \
        SUBGROUP_SYNC(); \
        MULTIPLY_STEP(set, x_off); \
    }

void main() {
    uint warp = WARP_ID;
    lane = LANE_ID;
    sub_row0 = warp * FM * TM;
    uint ways = max(p.split, 1u);
    tile_y = gl_WorkGroupID.y / ways;
    split_z = gl_WorkGroupID.y % ways;

    // Named by literal indices below, as in matmul_coopmat.comp, so that the
    // accumulators stay in registers.
    Acc acc[MAX_FRAGS * MAX_FRAGS];
    [[unroll]] for (uint f = 0u; f < FM * FN; f++) {
        ACC_ZERO(acc[f]);
    }

    // This workgroup's steps: all, or its split's consecutive share.
    uint all_steps = (p.n_in + BK - 1u) / BK;
    uint share = (all_steps + ways - 1u) / ways;
    uint first_step = min(split_z * share, all_steps);
    uint n_steps = min(share, all_steps - first_step);
    uint k_base = first_step * BK;

    // Steps 0 and 1 in flight; every step refills its set two ahead. The
    // loop is unrolled by two so that each set is named by a literal.
    if (n_steps > 0u) {
        fetch_rows(k_base, 0u);
    }
    if (n_steps > 1u) {
        fetch_rows(k_base + BK, 1u);
    }
    for (uint s2 = 0u; s2 < n_steps; s2 += 2u) {
        RUN_STEP(s2, 0u);
        if (s2 + 1u < n_steps) {
            RUN_STEP(s2 + 1u, 1u);
        }
    }

    uint c_base = warp * TM * TN;
#define WRITE_FRAGMENT(f) if ((f) < FM * FN) { write_fragment(acc[f], f, c_base, lane, warp, 0u); }
    WRITE_FRAGMENT(0u) WRITE_FRAGMENT(1u) WRITE_FRAGMENT(2u) WRITE_FRAGMENT(3u)
    WRITE_FRAGMENT(4u) WRITE_FRAGMENT(5u) WRITE_FRAGMENT(6u) WRITE_FRAGMENT(7u)
    WRITE_FRAGMENT(8u) WRITE_FRAGMENT(9u) WRITE_FRAGMENT(10u) WRITE_FRAGMENT(11u)
    WRITE_FRAGMENT(12u) WRITE_FRAGMENT(13u) WRITE_FRAGMENT(14u) WRITE_FRAGMENT(15u)
    if (p.split > 1u) {
        finish_split();
    }
}
