#version 450
// The rate of cooperative-matrix products alone on this device and driver
// (the `coopmat_peak` bench, measurement only): every subgroup multiplies
// two constant fragments into ACCS independent accumulators, p.n_in rounds,
// with no memory traffic and no barrier in the loop, then stores one
// fragment so that nothing is optimised away. Its spec constants are the
// matmul's (coopmat.rs, CoopMatTile::spec: 1-3 the fragment shape, 9 the
// workgroup size), so it compiles the way matmul_coopmat.comp does. With
// FIXED_SHAPE the fragment shape is 16 x 16 x 16 in the source instead of
// specialisation constants: comparing both tells whether the driver's
// lowering depends on knowing the shape before specialisation.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

#if defined(FIXED_SHAPE)
const uint TM = 16u;
const uint TN = 16u;
const uint TK = 16u;
#else
layout(constant_id = 1) const uint TM = 16u;
layout(constant_id = 2) const uint TN = 16u;
layout(constant_id = 3) const uint TK = 16u;
#endif
layout(local_size_x_id = 9) in;

#include "common.glsl"

// Independent accumulators per subgroup (coopmat_peak.rs counts the same).
#define ACCS 8u

#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, TM, TK, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, TK, TN, gl_MatrixUseB>
#define ACC coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>

void main() {
    FRAG_A a = FRAG_A(float16_t(0.0078125));
    FRAG_B b = FRAG_B(float16_t(0.0078125));
    ACC acc[ACCS];
    [[unroll]] for (uint j = 0u; j < ACCS; j++) {
        acc[j] = ACC(float(j));
    }
    for (uint i = 0u; i < p.n_in; i++) {
        [[unroll]] for (uint j = 0u; j < ACCS; j++) {
            acc[j] = coopMatMulAdd(a, b, acc[j]);
        }
    }
    [[unroll]] for (uint j = 1u; j < ACCS; j++) {
        acc[0] = acc[0] + acc[j];
    }
    uint slot = workgroup_index() * gl_NumSubgroups + gl_SubgroupID;
    coopMatStore(acc[0], y, slot * TM * TN, TM, gl_CooperativeMatrixLayoutColumnMajor);
}
