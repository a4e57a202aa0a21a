#version 450
// Gated activation in place: gate[i] = act(gate[i]) * up[i], with gate and
// up the two halves of the gate/up matmul output. The down projection then
// reads the first half as its input.
//
// With `quantise` set the kernel instead writes act(gate) * up quantised for
// the int8 matvec (int8_acts.glsl) into binding 1, one 32-value block per
// invocation, and leaves the gate half as it is: the down projection then
// reads the int8 copy (decode steps whose down projection takes int8
// activations), so its input is quantised once, not once per workgroup.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;

layout(std430, binding = 0) buffer GateUp { float gu[]; };
layout(std430, binding = 0) readonly buffer GateUp4 { vec4 gu4[]; };
layout(std430, binding = 1) writeonly buffer Int8Acts { uint q8[]; };

layout(push_constant) uniform Push {
    // n_tok * n_ff: where `up` starts.
    uint count;
    // 0: SiLU (SwiGLU); 1: tanh-approximated GELU (GeGLU).
    uint gelu;
    uint groups_x;
    // Row width (n_ff; a multiple of 32 when quantising).
    uint n;
    // 1: write the int8 copy (one invocation per block of 32) instead.
    uint quantise;
} p;

#include "gated_act.glsl"
#define INT8_WRITER 1
#include "int8_acts.glsl"

void main() {
    uint i = (gl_WorkGroupID.y * p.groups_x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
    if (p.quantise == 0u) {
        if (i < p.count) {
            gu[i] = gated_act(gu[i], p.gelu) * gu[p.count + i];
        }
        return;
    }
    // i is a block: row i / (n / 32), block i % (n / 32); count and n are
    // multiples of 32, so the vec4 reads are aligned.
    uint blocks_per_row = p.n / 32u;
    if (i >= p.count / 32u) {
        return;
    }
    uint first4 = i * 8u;
    uint up4 = p.count / 4u;
    vec4 v[8];
    for (uint k = 0u; k < 8u; k++) {
        vec4 g = gu4[first4 + k];
        vec4 u = gu4[up4 + first4 + k];
        for (uint c = 0u; c < 4u; c++) {
            v[k][c] = gated_act(g[c], p.gelu) * u[c];
        }
    }
    store_int8_block(v, i / blocks_per_row, i % blocks_per_row, p.n);
}
