#version 450
// Reads one word of 32-byte sectors of a weight chunk so that the matvec
// after the next barrier finds them in the L2 cache. Spans record it beside
// a stage that does not touch those weights (span/prefetch.rs), so that the
// memory bus works while that stage is bound by latency.
//
// Uses the matmul bindings and push constants (common.glsl): the sectors are
// the first n_in bytes (rounded up to a sector) of each of the n_rows rows of
// binding 0 (with READ_UP: of binding 5, the up weights of a gate/up set);
// the host puts the bytes per row in n_in, at most row_stride. A row's
// prefix rather than the chunk's first bytes: the matvec's workgroups run
// their rows side by side, so a prefix of every row shortens each of them,
// where whole rows would shorten only some. groups_x is this grid's width.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = 256) in;

#include "common.glsl"

#if defined(READ_UP)
layout(std430, binding = 5) readonly buffer UpWeights { uint up_w[]; };
#define WEIGHT_WORD(i) up_w[i]
#else
#define WEIGHT_WORD(i) w[i]
#endif

// Sectors per invocation, one workgroup-wide stride apart: their loads are
// in flight together, and a workgroup covers LOADS * 8 KB.
const uint LOADS = 4u;

void main() {
    uint per_row = (min(p.n_in, p.row_stride) + 31u) / 32u;
    uint sectors = p.n_rows * per_row;
    uint first = workgroup_index() * 256u * LOADS + gl_LocalInvocationID.x;
    uint acc = 0u;
    [[unroll]] for (uint k = 0u; k < LOADS; k++) {
        uint i = first + 256u * k;
        if (i < sectors) {
            uint row = i / per_row;
            uint byte = row * p.row_stride + 32u * (i % per_row);
            acc ^= WEIGHT_WORD(byte / 4u);
        }
    }
    // Never true at run time (accumulate is 0 or 1), but the compiler cannot
    // know it, so the loads stay.
    if (p.accumulate == 0xDEADu && acc == 1u) {
        y[p.y_offset] = 0.0;
    }
}
