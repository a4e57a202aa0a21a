// The row blocks and grid-wide waits of the persistent kernels
// (persistent_layer_probe.comp, persistent_decode_layer.comp).
//
// A matvec phase's rows are cut into blocks dealt to the workgroups in turn.
// Each invocation holds up to MAXU units (matvec_units.glsl) of a block: the
// units lane, lane + tpr, ... of its rows, where tpr invocations share a
// row. The phase's input sits in shared memory as f16 pairs (xs).
//
// The includer declares WG, MAXU, SPIN_LIMIT, a `Phase` with `rows` and
// `n_in`, the shared `xs[]` and `partial[WG * MAXU / 4u]`, the binding
// `arrivals[]` (word 0 the arrival counter, word 1 the failure word), the
// push constant `p.groups_x`, and includes matvec_units.glsl and
// GL_KHR_memory_scope_semantics first. It may name other words of
// `arrivals` for the counter and the failure word (COUNTER_WORD,
// FAILURE_WORD), and a unit type of its own (BLOCK_UNIT, with
// decode_run for it and UNIT_X4(un, unit, run) for its runs' x).

#ifndef BLOCK_UNIT
#define BLOCK_UNIT Unit
#endif
#ifndef UNIT_X4
#define UNIT_X4(un, unit, run) run_x4(unit, run)
#endif

// How a phase's blocks are cut: invocations per row (tpr), units per row and
// invocation (upt), rows per invocation (rpt) and rows per block (rb).
struct Cut {
    uint units;
    uint tpr;
    uint upt;
    uint rpt;
    uint rb;
};

Cut cut_of(uint n_in) {
    Cut c;
    c.units = max(n_in / UNIT_VALUES, 1u);
    c.tpr = min(c.units, WG);
    c.upt = (c.units + c.tpr - 1u) / c.tpr;
    c.rpt = max(MAXU / c.upt, 1u);
    c.rb = (WG / c.tpr) * c.rpt;
    return c;
}

// Slot k of this invocation in block b: its row (clamped into the phase)
// and unit (clamped into the row); valid says whether it counts.
void slot_place(Phase ph, Cut c, uint b, uint k, out uint row, out uint unit, out bool valid) {
    uint tid = gl_LocalInvocationID.x;
    uint rg = tid / c.tpr;
    uint lane = tid % c.tpr;
    uint r = b * c.rb + rg * c.rpt + k / c.upt;
    uint u = lane + (k % c.upt) * c.tpr;
    valid = rg < WG / c.tpr && k < c.rpt * c.upt && r < ph.rows && u < c.units;
    row = min(r, ph.rows - 1u);
    unit = min(u, c.units - 1u);
}

vec4 x4(uint i) {
    return vec4(unpackHalf2x16(xs[2u * i]), unpackHalf2x16(xs[2u * i + 1u]));
}

// Sums block b of phase ph from its units (loaded from the phase's weights
// at byte0 by load_block) and the staged input; every invocation calls it.
// Invocation tid < rb gets row b * rb + tid and its sum (true when that row
// is in the phase).
bool block_sum(BLOCK_UNIT un[MAXU], Phase ph, uint b, out uint out_row, out float out_sum) {
    Cut c = cut_of(ph.n_in);
    float acc[MAXU];
    for (uint k = 0u; k < MAXU; k++) {
        acc[k] = 0.0;
    }
    for (uint k = 0u; k < MAXU; k++) {
        uint row;
        uint unit;
        bool valid;
        slot_place(ph, c, b, k, row, unit, valid);
        if (!valid) {
            continue;
        }
        for (uint run = 0u; run < RUNS; run++) {
            uint xr = UNIT_X4(un[k], unit, run);
            vec4 x0 = x4(xr);
            vec4 x1 = x4(xr + 1u);
            vec4 x2 = x4(xr + 2u);
            vec4 x3 = x4(xr + 3u);
            float xsum = dot((x0 + x1) + (x2 + x3), vec4(1.0));
            vec4 q[4];
            float scale;
            float minv;
            decode_run(un[k], run, q, scale, minv);
            float s = (dot(q[0], x0) + dot(q[1], x1)) + (dot(q[2], x2) + dot(q[3], x3));
            acc[k / c.upt] += scale * s + minv * xsum;
        }
    }
    // A row's tpr invocations are whole subgroups (tpr is a multiple of the
    // subgroup size: the hosts take rows of 1024 values or more).
    uint tid = gl_LocalInvocationID.x;
    uint per_row = c.tpr / gl_SubgroupSize;
    uint rg = tid / c.tpr;
    uint sub_in_row = (tid % c.tpr) / gl_SubgroupSize;
    for (uint j = 0u; j < c.rpt; j++) {
        float s = subgroupAdd(acc[j]);
        if (subgroupElect() && rg < WG / c.tpr) {
            partial[(rg * c.rpt + j) * per_row + sub_in_row] = s;
        }
    }
    barrier();
    out_row = b * c.rb + tid;
    out_sum = 0.0;
    if (tid >= c.rb || out_row >= ph.rows) {
        return false;
    }
    for (uint j = 0u; j < per_row; j++) {
        out_sum += partial[tid * per_row + j];
    }
    return true;
}

#include "grid_wait.glsl"
