// Bindings and push constants shared by the matmul kernels.
//
// y[t * y_stride + y_offset + r] = sum_i W[r][i] * x[t * n_in + i] for the
// n_rows rows of one weight chunk. Row r of the chunk starts at byte
// r * row_stride of the weight buffer (row_stride is a multiple of 16).

layout(std430, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, binding = 1) readonly buffer X { vec4 x[]; };
// Read as well as written: with `accumulate` the products are added to y
// (a residual stream), which saves the add kernel and its barrier.
layout(std430, binding = 2) buffer Y { float y[]; };

layout(push_constant) uniform Params {
    uint n_in;
    uint n_rows;
    uint n_tok;
    uint row_stride;
    uint y_stride;
    uint y_offset;
    // Workgroups along x; the grid is two-dimensional so that more than
    // 65535 workgroups fit.
    uint groups_x;
    // 0: y = W x; 1: y += W x (every element has one writer).
    uint accumulate;
    // The NORM matvec (matvec.comp): offset of the RMS-norm weights in the
    // parameter buffer (binding 3) and the norm's epsilon; x is then the
    // un-normed residual stream and the kernel normalises it on the fly.
    uint norm_off;
    float norm_eps;
    // The deferred norm (matvec.comp RESNORM / PRENORMED): float offset of
    // the per-workgroup sums of squares in the normed-input buffer, and how
    // many there are per token (the RESNORM matvec's workgroups).
    uint part_off;
    uint parts;
    // The cooperative batch tile's steps split across workgroups
    // (matmul_coopmat.comp, split_k.rs): ways (1: none), the uint offset of
    // the dispatch's arrival counters and the float offset of its partial
    // tiles in the scratch at binding 3.
    uint split;
    uint split_count_off;
    uint split_part_off;
} p;

// Stores one output element, added to what y holds when accumulating.
void store_y(uint i, float v) {
    y[i] = p.accumulate != 0u ? y[i] + v : v;
}

uint workgroup_index() {
    return gl_WorkGroupID.y * p.groups_x + gl_WorkGroupID.x;
}
