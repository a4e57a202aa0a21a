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

const uint LANES = 32u;
// Rows of a fragment, and of a workgroup.
const uint TM = 16u;
const uint WG_ROWS = TM * RF;
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

#if defined(TYPE_Q4_K) || defined(TYPE_Q6_K)
#include "matvec_i8mm_h16.glsl"
#else
#include "matvec_i8mm_staged.glsl"
#endif
