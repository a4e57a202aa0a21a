#version 450
// RMS norm of rows: dst[r] = src[r] * w / rms(src[r]), one workgroup per row,
// in f32 or (`quantise` 2) in f16 for the cooperative prefill kernel.
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
// dst as f16 pairs and quads (`quantise` 2): row r from half 2 dst_off + r n,
// the bytes where its f32 row would start for r = 0.
layout(std430, binding = 1) buffer DstH { uint dst_h[]; };
layout(std430, binding = 1) buffer DstH2 { uvec2 dst_h2[]; };

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
    // 1: write the normed row quantised to q8 instead of to dst (n a
    // multiple of 32; the matvecs after the norm read nothing else); 2:
    // write it to dst in f16 (n even; the cooperative prefill kernel's
    // X_F16 input).
    uint quantise;
} p;

shared float part_max[WG_SIZE];
shared int part_sum[WG_SIZE];

#define INT8_WRITER 1
#define INT8_PARTS_WRITER 1
#include "int8_acts.glsl"

// Quantises the normed row in blocks of 32 values, one block per thread
// (rows not on 16-byte words), computing the values from src.
void quantise_row(uint row, uint s0, float scale) {
    for (uint b = gl_LocalInvocationID.x; b < p.n / 32u; b += WG_SIZE) {
        vec4 v[8];
        for (uint k = 0u; k < 8u; k++) {
            for (uint c = 0u; c < 4u; c++) {
                uint i = 32u * b + 4u * k + c;
                v[k][c] = src[s0 + i] * scale * params[p.w_off + i];
            }
        }
        store_int8_block(v, row, b, p.n);
    }
}

shared float partial[WG_SIZE];
shared float partial16[16];

// Quantises the normed row with one 16-byte word per invocation, eight
// invocations per 32-value block meeting in shared memory (as span_act.comp
// does): a decode step's row is then one or two words per invocation
// instead of 16 loads for half of the invocations. Rows on 16-byte words
// only; every invocation must call it (barriers).
void quantise_row_wide(uint row, uint s0, float scale) {
    uint j = gl_LocalInvocationID.x;
    for (uint j0 = 0u; j0 < p.n / 4u; j0 += WG_SIZE) {
        uint w = j0 + j;
        bool in_row = w < p.n / 4u;
        vec4 v = in_row ? src4[s0 / 4u + w] * scale * params4[p.w_off / 4u + w] : vec4(0.0);
        store_int8_part(v, in_row, row, w / 8u, p.n);
        // part_max and part_sum are reused by the next word.
        barrier();
    }
}

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
    // Two levels of 16 (two barriers instead of a tree's nine: a decode
    // step's norm is a chain of latencies).
    partial[tid] = sum;
    barrier();
    if (tid < 16u) {
        float s16 = 0.0;
        for (uint k = 0u; k < 16u; k++) {
            s16 += partial[16u * tid + k];
        }
        partial16[tid] = s16;
    }
    barrier();
    float total = 0.0;
    for (uint k = 0u; k < 16u; k++) {
        total += partial16[k];
    }
    float scale = 1.0 / sqrt(total / float(p.n) + p.eps);
    if (p.quantise == 2u) {
        // Word index of the row's first pair: (2 dst_off + row n) / 2.
        uint h0 = p.dst_off + row * (p.n / 2u);
        if (wide) {
            for (uint i = tid; i < p.n / 4u; i += WG_SIZE) {
                vec4 v = src4[s0 / 4u + i] * scale * params4[p.w_off / 4u + i];
                dst_h2[h0 / 2u + i] = uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw));
            }
        } else {
            for (uint j = tid; j < p.n / 2u; j += WG_SIZE) {
                vec2 v = vec2(src[s0 + 2u * j], src[s0 + 2u * j + 1u]) * scale
                    * vec2(params[p.w_off + 2u * j], params[p.w_off + 2u * j + 1u]);
                dst_h[h0 + j] = packHalf2x16(v);
            }
        }
        return;
    }
    if (p.quantise != 0u) {
        if (wide) {
            quantise_row_wide(row, s0, scale);
        } else {
            quantise_row(row, s0, scale);
        }
        return;
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
