#version 450
// Measurement only (the persistent_chain bench of fish-vk): a chain of
// dependent Q4_K matvecs run by ONE dispatch of resident workgroups with a
// grid-wide barrier between them, the shape a persistent span kernel would
// take, to compare with the same matvecs as dependent dispatches
// (matvec_serial) and back to back (matvec). Matvec m multiplies copy
// m % p.y_stride of the weights (p.n_rows rows each, consecutive in one
// buffer) by the output of matvec m - 1: x and y alternate between
// bindings 1 and 2, read coherently (they are rewritten within the
// dispatch). Workgroups take blocks of ROWS rows in turn (p.groups_x of
// them, all resident); p.n_tok is the chain's length. The arrival counter
// is the word after x at binding 1 (zeroed before the dispatch).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require

#define TYPE_Q4_K
layout(local_size_x = 64) in;
const uint WG = 64u;
const uint ROWS = 4u;

#include "common.glsl"
layout(std430, binding = 0) readonly buffer Weights4 { uvec4 w4[]; };
#include "dequant.glsl"
#include "matvec_units.glsl"

layout(std430, binding = 1) coherent buffer VecA { vec4 a4[]; };
layout(std430, binding = 1) coherent buffer VecA1 { float a1[]; };
layout(std430, binding = 1) volatile coherent buffer Arrivals { uint arrivals[]; };
layout(std430, binding = 2) coherent buffer VecB { vec4 b4[]; };
layout(std430, binding = 2) coherent buffer VecB1 { float b1[]; };

const uint SPIN_LIMIT = 1u << 22;

// One partial sum per subgroup (subgroups are at least 4 lanes wide).
shared float partial[ROWS][WG / 4u];

vec4 input4(bool from_a, uint i) {
    if (from_a) {
        return a4[i];
    }
    return b4[i];
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint n_units = p.n_in / UNIT_VALUES;
    uint counter = p.n_in;
    for (uint m = 0u; m < p.n_tok; m++) {
        bool from_a = (m & 1u) == 0u;
        uint copy_row0 = (m % p.y_stride) * p.n_rows;
        for (uint row0 = gl_WorkGroupID.x * ROWS; row0 < p.n_rows; row0 += p.groups_x * ROWS) {
            float acc[ROWS];
            for (uint r = 0u; r < ROWS; r++) {
                acc[r] = 0.0;
            }
            for (uint u = tid; u < n_units; u += WG) {
                Unit un[ROWS];
                for (uint r = 0u; r < ROWS; r++) {
                    un[r] = load_unit((copy_row0 + row0 + r) * p.row_stride, u);
                }
                for (uint run = 0u; run < RUNS; run++) {
                    uint xr = run_x4(u, run);
                    vec4 x0 = input4(from_a, xr);
                    vec4 x1 = input4(from_a, xr + 1u);
                    vec4 x2 = input4(from_a, xr + 2u);
                    vec4 x3 = input4(from_a, xr + 3u);
                    float xsum = dot((x0 + x1) + (x2 + x3), vec4(1.0));
                    for (uint r = 0u; r < ROWS; r++) {
                        vec4 q[4];
                        float scale;
                        float minv;
                        decode_run(un[r], run, q, scale, minv);
                        float s = (dot(q[0], x0) + dot(q[1], x1)) + (dot(q[2], x2) + dot(q[3], x3));
                        acc[r] += scale * s + minv * xsum;
                    }
                }
            }
            for (uint r = 0u; r < ROWS; r++) {
                float s = subgroupAdd(acc[r]);
                if (subgroupElect()) {
                    partial[r][gl_SubgroupID] = s;
                }
            }
            barrier();
            if (tid < ROWS) {
                float s = 0.0;
                for (uint j = 0u; j < gl_NumSubgroups; j++) {
                    s += partial[tid][j];
                }
                // Scaled down so that the chain stays finite.
                if (from_a) {
                    b1[row0 + tid] = s * 1e-3;
                } else {
                    a1[row0 + tid] = s * 1e-3;
                }
            }
            barrier();
        }
        // Every workgroup's rows of matvec m are written before any
        // workgroup reads them in matvec m + 1.
        if (tid == 0u) {
            memoryBarrierBuffer();
            atomicAdd(arrivals[counter], 1u);
            uint target = (m + 1u) * p.groups_x;
            for (uint spins = 0u; arrivals[counter] < target && spins < SPIN_LIMIT; spins++) {
            }
            memoryBarrierBuffer();
        }
        barrier();
    }
}
