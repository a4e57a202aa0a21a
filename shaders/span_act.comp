#version 450
// Gated activation in place: gate[i] = act(gate[i]) * up[i], with gate and
// up the two halves of the gate/up matmul output. The down projection then
// reads the first half as its input.
//
// With `quantise` 2 it writes act(gate) * up in f16 pairs into binding 1
// (one invocation per two values; value i at half i) for a down projection
// on the cooperative prefill kernel, and leaves gate/up as they are.
//
// With `quantise` 1 the kernel instead writes act(gate) * up quantised for
// the int8 matvec (int8_acts.glsl) into binding 1, four values per
// invocation and eight invocations per 32-value block (they meet in shared
// memory for the block's max and sums), and leaves the gate half as it is:
// the down projection then reads the int8 copy (decode steps whose down
// projection takes int8 activations), so its input is quantised once, not
// once per workgroup. (One invocation per block took 8.1 us per llama-8b
// decode layer on the H200: 448 invocations each waiting on 16 loads.)
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;

layout(std430, binding = 0) buffer GateUp { float gu[]; };
layout(std430, binding = 0) readonly buffer GateUp4 { vec4 gu4[]; };
layout(std430, binding = 1) writeonly buffer Int8Acts { uint q8[]; };
layout(std430, binding = 1) writeonly buffer Halves { uint h16[]; };

layout(push_constant) uniform Push {
    // n_tok * n_ff: where `up` starts.
    uint count;
    // 0: SiLU (SwiGLU); 1: tanh-approximated GELU (GeGLU).
    uint gelu;
    uint groups_x;
    // Row width (n_ff; a multiple of 32 when quantising).
    uint n;
    // 1: write the int8 copy (one invocation per four values) instead; 2:
    // the f16 copy (one invocation per two values; count even).
    uint quantise;
} p;

#include "gated_act.glsl"

shared float part_max[256];
shared int part_sum[256];

#define INT8_PARTS_WRITER 1
#include "int8_acts.glsl"

void main() {
    uint i = (gl_WorkGroupID.y * p.groups_x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
    if (p.quantise == 0u) {
        if (i < p.count) {
            gu[i] = gated_act(gu[i], p.gelu) * gu[p.count + i];
        }
        return;
    }
    if (p.quantise == 2u) {
        if (i < p.count / 2u) {
            vec2 v = vec2(gated_act(gu[2u * i], p.gelu) * gu[p.count + 2u * i],
                          gated_act(gu[2u * i + 1u], p.gelu) * gu[p.count + 2u * i + 1u]);
            h16[i] = packHalf2x16(v);
        }
        return;
    }
    // Quantising (uniform: the barriers in store_int8_part are reached by
    // every invocation). i covers values 4i .. 4i + 3, part i % 8 of block
    // i / 8; count and n are multiples of 32, so blocks never straddle
    // workgroups.
    bool in_range = i < p.count / 4u;
    vec4 v = vec4(0.0);
    if (in_range) {
        vec4 g = gu4[i];
        vec4 u = gu4[p.count / 4u + i];
        for (uint c = 0u; c < 4u; c++) {
            v[c] = gated_act(g[c], p.gelu) * u[c];
        }
    }
    // A row is n / 32 blocks of eight invocations.
    uint block = i / 8u;
    store_int8_part(v, in_range, block / (p.n / 32u), block % (p.n / 32u), p.n);
}
