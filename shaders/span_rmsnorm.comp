#version 450
// RMS norm of rows: dst[r] = src[r] * w / rms(src[r]), one workgroup per row.
// Covers the layer norms (rows = tokens, n = n_embd), the per-head q/k norms
// (rows = token heads, n = head_dim, in place) and the Gemma post-norms,
// which add the normed row into the residual stream (ACCUMULATE) so that
// the residual add costs no extra dispatch.
#extension GL_GOOGLE_include_directive : require

#define WG_SIZE 256u
layout(local_size_x = 256) in;

layout(std430, binding = 0) buffer Src { float src[]; };
layout(std430, binding = 1) buffer Dst { float dst[]; };
layout(std430, binding = 2) readonly buffer Params { float params[]; };
// The same buffers as 16-byte words for rows whose offsets and width are
// multiples of 4 (every layer norm and the usual head widths): each thread
// then loads a few vec4 instead of many floats, and a decode-step norm is
// one short round of loads rather than a latency chain.
layout(std430, binding = 0) buffer Src4 { vec4 src4[]; };
layout(std430, binding = 1) buffer Dst4 { vec4 dst4[]; };
layout(std430, binding = 2) readonly buffer Params4 { vec4 params4[]; };

// The normed rows quantised for the int8 matvec (int8_acts.glsl), row r at
// 16-byte word r * int8_token_vec4s(n), when `quantise` is set.
layout(std430, binding = 3) writeonly buffer Int8Acts { uint q8[]; };

layout(push_constant) uniform Push {
    uint n;
    uint src_off;
    uint dst_off;
    uint w_off;
    float eps;
    // 0: dst = norm(src) * w; 1: dst += norm(src) * w.
    uint accumulate;
    // 1: also write the normed row, quantised, to q8 (src and dst distinct,
    // n a multiple of 32).
    uint quantise;
} p;

#define INT8_WRITER 1
#include "int8_acts.glsl"

// Quantises the normed row in blocks of 32 values, one block per thread; the
// values are recomputed from src (unchanged: src is not dst here) rather
// than read back from dst, so no barrier is needed. Rows on 16-byte words
// load them as such (a block is then 16 loads in flight, not 64).
void quantise_row(uint row, uint s0, float scale, bool wide) {
    for (uint b = gl_LocalInvocationID.x; b < p.n / 32u; b += WG_SIZE) {
        vec4 v[8];
        for (uint k = 0u; k < 8u; k++) {
            uint i = 32u * b + 4u * k;
            if (wide) {
                v[k] = src4[(s0 + i) / 4u] * scale * params4[(p.w_off + i) / 4u];
            } else {
                for (uint c = 0u; c < 4u; c++) {
                    v[k][c] = src[s0 + i + c] * scale * params[p.w_off + i + c];
                }
            }
        }
        store_int8_block(v, row, b, p.n);
    }
}

shared float partial[WG_SIZE];

void main() {
    uint row = gl_WorkGroupID.x;
    uint tid = gl_LocalInvocationID.x;
    uint s0 = p.src_off + row * p.n;
    uint d0 = p.dst_off + row * p.n;
    bool wide = ((p.n | p.src_off | p.dst_off | p.w_off) & 3u) == 0u;
    float sum = 0.0;
    if (wide) {
        for (uint i = tid; i < p.n / 4u; i += WG_SIZE) {
            vec4 v = src4[s0 / 4u + i];
            sum += dot(v, v);
        }
    } else {
        for (uint i = tid; i < p.n; i += WG_SIZE) {
            float v = src[s0 + i];
            sum += v * v;
        }
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
    if (p.quantise != 0u) {
        quantise_row(row, s0, scale, wide);
    }
    // Every thread writes only the elements it read, so src may alias dst.
    if (wide) {
        for (uint i = tid; i < p.n / 4u; i += WG_SIZE) {
            vec4 v = src4[s0 / 4u + i] * scale * params4[p.w_off / 4u + i];
            if (p.accumulate != 0u) {
                dst4[d0 / 4u + i] += v;
            } else {
                dst4[d0 / 4u + i] = v;
            }
        }
    } else {
        for (uint i = tid; i < p.n; i += WG_SIZE) {
            float v = src[s0 + i] * scale * params[p.w_off + i];
            if (p.accumulate != 0u) {
                dst[d0 + i] += v;
            } else {
                dst[d0 + i] = v;
            }
        }
    }
}
