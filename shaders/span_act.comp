#version 450
// Gated activation in place: gate[i] = act(gate[i]) * up[i], with gate and
// up the two halves of the gate/up matmul output. The down projection then
// reads the first half as its input.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;

layout(std430, binding = 0) buffer GateUp { float gu[]; };

layout(push_constant) uniform Push {
    // n_tok * n_ff: where `up` starts.
    uint count;
    // 0: SiLU (SwiGLU); 1: tanh-approximated GELU (GeGLU).
    uint gelu;
    uint groups_x;
} p;

#include "gated_act.glsl"

void main() {
    uint i = (gl_WorkGroupID.y * p.groups_x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
    if (i >= p.count) {
        return;
    }
    gu[i] = gated_act(gu[i], p.gelu) * gu[p.count + i];
}
