#version 450
// Measurement only (the atomic_add bench of fish-vk): what it costs a
// dispatch to add one value per output row from every workgroup into a
// shared vector, the reduction a feed-forward stage split along its inner
// dimension would end with (each workgroup owning a slice of gate/up rows
// and the matching columns of down contributes a whole vector). Each of
// the p.groups workgroups of 256 invocations makes p.per_thread additions
// per invocation, invocation i of round k at row i + 256 * k (modulo
// p.rows), in one of three modes (p.mode):
//   0: atomicAdd into one shared vector of p.rows counters (every
//      workgroup meets every row: the real reduction's contention);
//   1: atomicAdd into a vector of its own per workgroup (no contention);
//   2: plain stores into a vector of its own (the partial vectors a
//      reduction without atomics would write).
layout(local_size_x = 256) in;

// The matmul layout's binding 1 (x), zeroed before the timed dispatch.
layout(std430, binding = 1) buffer Sums { uint sums[]; };

// The matmul kernels' push constants: n_in, n_rows, n_tok, then groups_x.
layout(push_constant) uniform Probe {
    uint per_thread;
    uint rows;
    uint mode;
    uint unused[3];
    uint groups;
} p;

void main() {
    uint wg = gl_WorkGroupID.x;
    uint tid = gl_LocalInvocationID.x;
    uint base = p.mode == 0u ? 0u : wg * p.rows;
    for (uint k = 0u; k < p.per_thread; k++) {
        uint row = (tid + 256u * k) % p.rows;
        // A value that differs per workgroup and row, as a contribution would.
        uint v = (wg * 2654435761u) ^ row;
        if (p.mode == 2u) {
            sums[base + row] = v;
        } else {
            atomicAdd(sums[base + row], v);
        }
    }
}
