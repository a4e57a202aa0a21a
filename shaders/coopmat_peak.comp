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
// lowering depends on knowing the shape before specialisation. With
// SHARED_LOADS every round also loads its A and B fragments from shared
// memory (16-byte elements, rows padded as the prefill kernel pads them,
// the offset moving with the round so that no load leaves the loop): the
// cost of the fragment loads on top of the products.
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

#if defined(SHARED_LOADS)
// Four row blocks of fragments, rows of TK f16 values padded to a 16-byte
// stride of TK / 8 + 1 elements (the prefill kernel's 32-value rows take 20
// dwords; this keeps the same kind of bank spread for one fragment depth).
const uint ROW_ELEMS = TK / 8u + 1u;
const uint BLOCK_ROWS = 64u;
shared uvec4 tile[4u * BLOCK_ROWS * ROW_ELEMS];
#endif

void main() {
    FRAG_A a = FRAG_A(float16_t(0.0078125));
    FRAG_B b = FRAG_B(float16_t(0.0078125));
    ACC acc[ACCS];
    [[unroll]] for (uint j = 0u; j < ACCS; j++) {
        acc[j] = ACC(float(j));
    }
#if defined(SHARED_LOADS)
    // 0.0078125 in both halves of every word.
    for (uint e = gl_LocalInvocationIndex; e < tile.length(); e += gl_WorkGroupSize.x) {
        tile[e] = uvec4(0x20002000u);
    }
    barrier();
#endif
    for (uint i = 0u; i < p.n_in; i++) {
#if defined(SHARED_LOADS)
        uint block = (i + gl_SubgroupID) & 3u;
        coopMatLoad(a, tile, block * BLOCK_ROWS * ROW_ELEMS, ROW_ELEMS, gl_CooperativeMatrixLayoutRowMajor);
        coopMatLoad(b, tile, (block * BLOCK_ROWS + 16u) * ROW_ELEMS, ROW_ELEMS, gl_CooperativeMatrixLayoutColumnMajor);
#endif
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
