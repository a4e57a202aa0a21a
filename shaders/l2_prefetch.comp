#version 450
// Reads one word of every 32-byte sector of a weight chunk so that the
// matvec after the next barrier finds it in the L2 cache. Spans record it
// beside the small, latency-bound stages (norms, RoPE, attention, act*mul),
// during which the memory bus is otherwise idle.
//
// Uses the matmul bindings and push constants (common.glsl): the bytes are
// the first min(n_rows * row_stride, n_in) bytes of binding 0 (the host puts
// its byte budget in n_in); groups_x is this grid's width.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;

#include "common.glsl"

void main() {
    uint sectors = min(p.n_rows * p.row_stride, p.n_in) / 32u;
    uint i = workgroup_index() * 256u + gl_LocalInvocationID.x;
    if (i >= sectors) {
        return;
    }
    uint v = w[8u * i];
    // Never true at run time (accumulate is 0 or 1), but the compiler cannot
    // know it, so the load stays.
    if (p.accumulate == 0xDEADu && v == 1u) {
        y[p.y_offset] = 0.0;
    }
}
