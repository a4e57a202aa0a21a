#version 450
// Matrix-vector products for a few tokens (decode, speculative verification):
// each workgroup owns ROWS rows; every thread walks the same units
// (matvec_units.glsl) of all ROWS rows, so each x value it reads serves ROWS
// rows, and keeps one partial sum per row and token. The sums are reduced
// with subgroup arithmetic (USE_SUBGROUP) or through shared memory.
//
// Specialisation constants: 0 the workgroup size, 1 ROWS, 2 NT = tokens per
// pass (the host sets NT = n_tok up to 8, so NT = 1 keeps decode lean),
// 3 UNROLL = units a thread loads before it computes (a memory-bound matvec
// runs at the bytes of weights it keeps in flight; more costs registers).
//
// With NORM the kernel also applies the RMS norm before it (the span's
// attention and feed-forward norms, fused to save their dispatch and
// barrier): x is the raw residual stream, each value is multiplied by its
// norm weight as it is read, and since every value of x passes through
// exactly one thread of the workgroup, the sum of squares comes from the
// same loads: y = rsqrt(mean(x^2) + eps) * sum_i W_i (x_i * g_i).
//
// With RESNORM (a residual matvec: wo, down) and PRENORMED (the q/k/v or
// gate/up matvec after it) the norm between them is deferred instead: the
// first writes x * g and per-workgroup sums of squares beside the residual
// stream, the second reads x * g and scales its sums by the norm's factor
// (details at RESNORM below). Nothing is computed twice, unlike NORM,
// where every workgroup scales every x value.
//
// With GATED it also applies the gated activation before it (the span's
// act*mul, fused to save its dispatch and barrier in decode): x is the
// gate/up matmul output, the gate values first and the up values
// p.norm_off floats later, and each x value is act(gate) * up as it is read.
// Specialisation constant 4 picks the activation: 0 SiLU, 1 tanh GELU
// (span_act.comp computes the same expressions).
//
// With GATE_UP it is the gate/up matvec with the gated activation in its
// epilogue (the span's act*mul, fused in decode without redoing any work):
// binding 0 holds the gate weights and binding 5 the up weights (same type
// and shape), each workgroup sums its ROWS rows of both and stores
// act(gate) * up per row, which is what the down projection reads. The
// sums are those of the plain kernel with the same shape (each thread walks
// the same units, the reduction is the same), so only the activation's
// place changes. Specialisation constant 4 picks the activation as for GATED.
#extension GL_GOOGLE_include_directive : require
#if defined(USE_SUBGROUP)
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#endif

layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint ROWS = 4;
layout(constant_id = 2) const uint NT = 1;
layout(constant_id = 3) const uint UNROLL = 1;
#if defined(GATED) || defined(GATE_UP)
layout(constant_id = 4) const uint GELU = 0;
#endif
layout(local_size_x_id = 0) in;

#include "common.glsl"
// The same weights as 16-byte words, for the quant loads.
layout(std430, binding = 0) readonly buffer Weights4 { uvec4 w4[]; };
#include "dequant.glsl"
#include "matvec_units.glsl"

#if defined(GATE_UP)
layout(std430, binding = 5) readonly buffer UpWeights { uint up_w[]; };
layout(std430, binding = 5) readonly buffer UpWeights4 { uvec4 up_w4[]; };
// load_up_unit: load_unit over the up weights.
#define LOAD_UNIT load_up_unit
#define LOAD_WORDS4 up_w4
#define LOAD_WORDS up_w
#include "matvec_loads.glsl"
#undef LOAD_UNIT
#undef LOAD_WORDS4
#undef LOAD_WORDS
#endif
#if defined(GATED) || defined(GATE_UP)
#include "gated_act.glsl"
#endif

#if defined(RESNORM)
// The residual matvec that also prepares the next RMS norm (the deferred
// norm): it adds its products into the residual stream y (accumulate is
// set), writes each new value times its norm weight (binding 3 at
// p.norm_off) to the normed-input buffer (binding 4, token-major, n_rows
// values per token), and this workgroup's sum of the new values' squares
// per token to that buffer at p.part_off + token * parts_stride() +
// workgroup. The PRENORMED matvec after it sums those p.parts values in a
// fixed order and applies the norm's scale to its outputs, so no norm
// dispatch (and no barrier) runs between the two, and the result does not
// depend on the order in which workgroups finish.
layout(std430, binding = 3) readonly buffer NormWeights1 { float norm_w[]; };
layout(std430, binding = 4) writeonly buffer NormedInput { float normed[]; };
// The squares of the new values of item i = r * NT + t of store_sums.
shared float residual_sq[ROWS * NT];

void store_residual_and_normed(uint i, uint row, uint tok, float s) {
    uint yi = tok * p.y_stride + p.y_offset + row;
    float v = y[yi] + s;
    y[yi] = v;
    normed[tok * p.n_rows + row] = v * norm_w[p.norm_off + row];
    residual_sq[i] = v * v;
}
#endif

#if defined(RESNORM) || defined(PRENORMED)
// Floats per token of the per-workgroup sums of squares: whole vec4s, the
// padding zero, so the PRENORMED matvec reads them as vec4.
uint parts_stride() {
    return (p.parts + 3u) & ~3u;
}
#endif

#if defined(RESNORM)
// Rows in order, so the sum has the same bits for any pass width; the
// workgroup with the last sum also zeroes its token's padding.
void store_sums_of_squares(uint row0, uint t0) {
    for (uint t = gl_LocalInvocationID.x; t < NT; t += WG) {
        if (t0 + t < p.n_tok) {
            float s = 0.0;
            for (uint r = 0u; r < ROWS; r++) {
                s += residual_sq[r * NT + t];
            }
            uint base = p.part_off + (t0 + t) * parts_stride();
            uint wg = row0 / ROWS;
            normed[base + wg] = s;
            if (wg + 1u == p.parts) {
                for (uint j = p.parts; j < parts_stride(); j++) {
                    normed[base + j] = 0.0;
                }
            }
        }
    }
}
#endif

#include "matvec_reduce.glsl"

#if defined(NORM)
// The norm weights, as vec4 (the offset and n_in are multiples of 4).
layout(std430, binding = 3) readonly buffer NormWeights { vec4 norm_w4[]; };
#endif
#if defined(NORM) || defined(PRENORMED)
// Per token: this thread's share of sum(x^2).
float sumsq[NT];
#endif

#if defined(GATED)
// act(gate) * up for four values of x; `up` is p.norm_off / 4 vec4s later.
vec4 gated(uint xi) {
    vec4 g = x[xi];
    vec4 u = x[xi + p.norm_off / 4u];
    return vec4(gated_act(g.x, GELU), gated_act(g.y, GELU), gated_act(g.z, GELU), gated_act(g.w, GELU)) * u;
}
#endif

#if defined(NORM) || defined(PRENORMED)
shared float norm_partial[NT][WG / 4u];

// Multiplies every sum by its token's rsqrt(mean(x^2) + eps), the sums of
// squares reduced over the workgroup (subgroup sums, then shared memory).
void scale_by_norm() {
    for (uint t = 0u; t < NT; t++) {
        float s = subgroupAdd(sumsq[t]);
        if (subgroupElect()) {
            norm_partial[t][gl_SubgroupID] = s;
        }
    }
    barrier();
    for (uint t = 0u; t < NT; t++) {
        float total = 0.0;
        for (uint j = 0u; j < gl_NumSubgroups; j++) {
            total += norm_partial[t][j];
        }
        float scale = inversesqrt(total / float(p.n_in) + p.norm_eps);
        for (uint r = 0u; r < SUM_ROWS; r++) {
            acc[r][t] *= scale;
        }
    }
    // norm_partial is rewritten by the next pass only after store_sums' barriers.
}
#endif

void main() {
    uint row0 = workgroup_index() * ROWS;
    // Uniform across the workgroup, so the barriers below stay legal.
    if (row0 >= p.n_rows) {
        return;
    }
    uint tid = gl_LocalInvocationID.x;
    uint n_units = p.n_in / UNIT_VALUES;
    uint x_stride4 = p.n_in / 4u;
    uint row_byte[ROWS];
    for (uint r = 0u; r < ROWS; r++) {
        // Rows past the end read the last row; their sums are never written.
        row_byte[r] = min(row0 + r, p.n_rows - 1u) * p.row_stride;
    }

    for (uint t0 = 0u; t0 < p.n_tok; t0 += NT) {
        clear_sums();
#if defined(NORM)
        for (uint t = 0u; t < NT; t++) {
            sumsq[t] = 0.0;
        }
#endif
#if defined(PRENORMED)
        // x already holds each value times its norm weight; the sums of
        // squares are the RESNORM matvec's per-workgroup ones, this thread's
        // share summed here as vec4 (loaded before the weights, off their path).
        for (uint t = 0u; t < NT; t++) {
            uint base4 = (p.part_off + min(t0 + t, p.n_tok - 1u) * parts_stride()) / 4u;
            float s = 0.0;
            for (uint j = tid; j < parts_stride() / 4u; j += WG) {
                vec4 v = x[base4 + j];
                s += (v.x + v.y) + (v.z + v.w);
            }
            sumsq[t] = s;
        }
#endif
        for (uint u0 = tid; u0 < n_units; u0 += UNROLL * WG) {
            // All loads of UNROLL units first, so that they are in flight together.
            Unit un[UNROLL][SUM_ROWS];
            for (uint i = 0u; i < UNROLL; i++) {
                // Units past the end reload the first one; they are skipped below.
                uint u = u0 + i * WG < n_units ? u0 + i * WG : u0;
                for (uint r = 0u; r < ROWS; r++) {
                    un[i][r] = load_unit(row_byte[r], u);
#if defined(GATE_UP)
                    un[i][ROWS + r] = load_up_unit(row_byte[r], u);
#endif
                }
            }
            for (uint i = 0u; i < UNROLL; i++) {
                uint u = u0 + i * WG;
                if (u >= n_units) {
                    break;
                }
                for (uint run = 0u; run < RUNS; run++) {
                    vec4 q[SUM_ROWS][4];
                    float scale[SUM_ROWS];
                    float minv[SUM_ROWS];
                    for (uint r = 0u; r < SUM_ROWS; r++) {
                        decode_run(un[i][r], run, q[r], scale[r], minv[r]);
                    }
                    uint xr = run_x4(u, run);
                    for (uint t = 0u; t < NT; t++) {
                        // Tokens past the end repeat the last one (never written).
                        uint xi = min(t0 + t, p.n_tok - 1u) * x_stride4 + xr;
#if defined(GATED)
                        vec4 x0 = gated(xi);
                        vec4 x1 = gated(xi + 1u);
                        vec4 x2 = gated(xi + 2u);
                        vec4 x3 = gated(xi + 3u);
#else
                        vec4 x0 = x[xi];
                        vec4 x1 = x[xi + 1u];
                        vec4 x2 = x[xi + 2u];
                        vec4 x3 = x[xi + 3u];
#endif
#if defined(NORM)
                        sumsq[t] += (dot(x0, x0) + dot(x1, x1)) + (dot(x2, x2) + dot(x3, x3));
                        uint g = p.norm_off / 4u + xr;
                        x0 *= norm_w4[g];
                        x1 *= norm_w4[g + 1u];
                        x2 *= norm_w4[g + 2u];
                        x3 *= norm_w4[g + 3u];
#endif
#if defined(HAS_MIN)
                        float xsum = dot((x0 + x1) + (x2 + x3), vec4(1.0));
#endif
                        for (uint r = 0u; r < SUM_ROWS; r++) {
                            float s = (dot(q[r][0], x0) + dot(q[r][1], x1)) + (dot(q[r][2], x2) + dot(q[r][3], x3));
#if defined(HAS_MIN)
                            acc[r][t] += scale[r] * s + minv[r] * xsum;
#else
                            acc[r][t] += scale[r] * s;
#endif
                        }
                    }
                }
            }
        }

#if defined(NORM) || defined(PRENORMED)
        scale_by_norm();
#endif
        store_sums(row0, t0);
    }
}
