#version 450
// Gated activation in place: gate[i] = act(gate[i]) * up[i], with gate and
// up the two halves of the gate/up matmul output. The down projection then
// reads the first half as its input.
layout(local_size_x = 256) in;

layout(std430, binding = 0) buffer GateUp { float gu[]; };

layout(push_constant) uniform Push {
    // n_tok * n_ff: where `up` starts.
    uint count;
    // 0: SiLU (SwiGLU); 1: tanh-approximated GELU (GeGLU).
    uint gelu;
    uint groups_x;
} p;

void main() {
    uint i = (gl_WorkGroupID.y * p.groups_x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
    if (i >= p.count) {
        return;
    }
    float g = gu[i];
    float a;
    if (p.gelu != 0u) {
        const float SQRT_2_OVER_PI = 0.7978846;
        const float COEF_A = 0.044715;
        // tanh saturates long before 10; clamping keeps exp inside it finite.
        float u = clamp(SQRT_2_OVER_PI * g * (1.0 + COEF_A * g * g), -10.0, 10.0);
        a = 0.5 * g * (1.0 + tanh(u));
    } else {
        a = g / (1.0 + exp(-g));
    }
    gu[i] = a * gu[p.count + i];
}
