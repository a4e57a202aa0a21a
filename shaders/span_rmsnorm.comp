#version 450
// RMS norm of rows: dst[r] = src[r] * w / rms(src[r]), one workgroup per row.
// Covers the layer norms (rows = tokens, n = n_embd), the per-head q/k norms
// (rows = token heads, n = head_dim, in place) and the Gemma post-norms,
// which add the normed row into the residual stream (ACCUMULATE) so that
// the residual add costs no extra dispatch.
#extension GL_GOOGLE_include_directive : require

#define WG_SIZE 128u
layout(local_size_x = 128) in;

layout(std430, binding = 0) buffer Src { float src[]; };
layout(std430, binding = 1) buffer Dst { float dst[]; };
layout(std430, binding = 2) readonly buffer Params { float params[]; };

layout(push_constant) uniform Push {
    uint n;
    uint src_off;
    uint dst_off;
    uint w_off;
    float eps;
    // 0: dst = norm(src) * w; 1: dst += norm(src) * w.
    uint accumulate;
} p;

shared float partial[WG_SIZE];

void main() {
    uint row = gl_WorkGroupID.x;
    uint tid = gl_LocalInvocationID.x;
    uint s0 = p.src_off + row * p.n;
    uint d0 = p.dst_off + row * p.n;
    float sum = 0.0;
    for (uint i = tid; i < p.n; i += WG_SIZE) {
        float v = src[s0 + i];
        sum += v * v;
    }
    partial[tid] = sum;
    barrier();
    for (uint stride = WG_SIZE / 2u; stride > 0u; stride >>= 1u) {
        if (tid < stride) {
            partial[tid] += partial[tid + stride];
        }
        barrier();
    }
    float scale = 1.0 / sqrt(partial[0] / float(p.n) + p.eps);
    // Every thread writes only the elements it read, so src may alias dst.
    for (uint i = tid; i < p.n; i += WG_SIZE) {
        float v = src[s0 + i] * scale * params[p.w_off + i];
        if (p.accumulate != 0u) {
            dst[d0 + i] += v;
        } else {
            dst[d0 + i] = v;
        }
    }
}
