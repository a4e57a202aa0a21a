#version 450
// Elementwise adds: the residual add (x += y) and the bias add (rows of y
// get the same vector from the parameter buffer).
layout(local_size_x = 256) in;

layout(std430, binding = 0) buffer Dst { float dst[]; };
layout(std430, binding = 1) readonly buffer Src { float src[]; };
layout(std430, binding = 2) readonly buffer Params { float params[]; };

layout(push_constant) uniform Push {
    uint count;
    uint dst_off;
    uint src_off;
    // 0: dst += src; else dst += params[w_off + i % row] (bias rows of `row`).
    uint row;
    uint w_off;
    uint groups_x;
} p;

void main() {
    uint i = (gl_WorkGroupID.y * p.groups_x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
    if (i >= p.count) {
        return;
    }
    float v = p.row == 0u ? src[p.src_off + i] : params[p.w_off + i % p.row];
    dst[p.dst_off + i] += v;
}
