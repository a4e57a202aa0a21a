#version 450
// Matrix-vector products of decode-sized batches on the matrix units: int8
// weight codes times int8 activations with int32 sums (VK_KHR_cooperative_
// matrix, 16 x TN x 32 s8 fragments), for x pre-quantised in the layout of
// int8_acts.glsl. Q4_K and Q6_K instead multiply dequantised f16 weights by
// x in f16 (16 x 8 x 16 fragments) built in registers (matvec_i8mm_h16.glsl);
// the other types stage int8 fragments through shared memory
// (matvec_i8mm_staged.glsl); with X_F16 those two read x in f16 instead
// (batched decode steps whose stages before write f16). With EMULATE_COOPMAT the products are
// plain code, so that everything else runs, and is tested, on any device.
//
// With GATE_UP (Q4_K on f16 x) it is the gate/up matvec of such a step with
// the activation in its epilogue: of a workgroup's RF row fragments the
// first half hold gate rows and the second half the up rows of the same
// indices (up weights at binding 5), and the workgroup stores act(gate) *
// up in f16 at binding 2 (token t from half t * n_rows), as span_act.comp's
// f16 copy, for the down projection: no act*mul dispatch and no barrier
// before it. Each row sums exactly as in the plain kernel with the same
// subgroups, so the values are those of the act*mul dispatch.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable
#if !defined(EMULATE_COOPMAT)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int32 : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif

// Subgroups per workgroup (each takes every WARPS-th step of the rows).
layout(constant_id = 0) const uint WARPS = 8u;
// Tokens per pass: the fragments' N (8 or 16, as the device offers).
layout(constant_id = 1) const uint TN = 8u;
// WARPS * 32.
layout(local_size_x_id = 2) in;
// Row fragments per subgroup: each x fragment is multiplied by RF fragments
// of 16 rows (the unstaged form only; the staged form takes 1).
layout(constant_id = 3) const uint RF = 1u;
#include "common.glsl"
layout(std430, binding = 0) readonly buffer Weights4 { uvec4 w4[]; };
#include "dequant.glsl"
#include "matvec_units.glsl"
#include "int8_acts.glsl"
layout(std430, binding = 1) readonly buffer XQ { uvec4 x_int8[]; };
layout(std430, binding = 1) readonly buffer XQF { float x_int8_f[]; };
#if defined(GATE_UP) && !(defined(TYPE_Q4_K) && defined(X_F16))
#error "GATE_UP is written for Q4_K on f16 x"
#endif
#if defined(GATE_UP)
// The activation (0 SiLU, 1 tanh GELU).
layout(constant_id = 4) const uint GELU = 0u;
layout(std430, binding = 5) readonly buffer UpWeights4 { uvec4 up_w4[]; };
layout(std430, binding = 5) readonly buffer UpWeights2 { uvec2 up_w2[]; };
layout(std430, binding = 2) writeonly buffer ActOut { uint act_h[]; };
#include "gated_act.glsl"
#endif

const uint LANES = 32u;
// Rows of a fragment, and of a workgroup.
const uint TM = 16u;
const uint WG_ROWS = TM * RF;
#if defined(GATE_UP)
// Row fragments per matrix, and output rows of a workgroup.
const uint MATRIX_FRAGS = RF / 2u;
#else
const uint MATRIX_FRAGS = RF;
#endif
const uint OUT_ROWS = TM * MATRIX_FRAGS;
const uint THREADS = WARPS * LANES;

// Each subgroup's sums of one pass, sh_sum[(subgroup * WG_ROWS + row) * TN
// + token], for the reduction.
shared float sh_sum[WARPS * WG_ROWS * TN];

// Adds the subgroups' sums of the pass at token t0 in subgroup order and
// stores them for the workgroup's rows from row0. Every invocation calls it
// after writing its sums (barriers).
void store_pass_sums(uint row0, uint t0) {
    barrier();
    for (uint i = gl_LocalInvocationIndex; i < WG_ROWS * TN; i += THREADS) {
        uint r = i / TN;
        uint t = i % TN;
        if (row0 + r < p.n_rows && t0 + t < p.n_tok) {
            float s = 0.0;
            for (uint w = 0u; w < WARPS; w++) {
                s += sh_sum[(w * WG_ROWS + r) * TN + t];
            }
            store_y((t0 + t) * p.y_stride + p.y_offset + row0 + r, s);
        }
    }
    barrier();
}

#if defined(GATE_UP)
// Stores act(gate) * up of the pass at token t0 for the workgroup's output
// rows from row0 in f16 pairs, each sum added in subgroup order as
// store_pass_sums adds it (n_rows, y_stride and y_offset are even).
void store_act_pass(uint row0, uint t0) {
    barrier();
    for (uint i = gl_LocalInvocationIndex; i < OUT_ROWS / 2u * TN; i += THREADS) {
        uint r = 2u * (i / TN);
        uint t = i % TN;
        if (row0 + r < p.n_rows && t0 + t < p.n_tok) {
            vec2 v;
            for (uint k = 0u; k < 2u; k++) {
                float gate = 0.0;
                float up = 0.0;
                for (uint w = 0u; w < WARPS; w++) {
                    gate += sh_sum[(w * WG_ROWS + r + k) * TN + t];
                    up += sh_sum[(w * WG_ROWS + OUT_ROWS + r + k) * TN + t];
                }
                v[k] = gated_act(gate, GELU) * up;
            }
            act_h[((t0 + t) * p.y_stride + p.y_offset + row0 + r) / 2u] = packHalf2x16(v);
        }
    }
    barrier();
}
#endif

#if defined(TYPE_Q4_K) || defined(TYPE_Q6_K)
#include "matvec_i8mm_h16.glsl"
#else
#include "matvec_i8mm_staged.glsl"
#endif
