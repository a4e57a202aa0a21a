#version 450
// Matrix-vector products for a few tokens (decode): each workgroup owns
// ROWS_PER_WG rows, its threads stride over the row in groups of 8 values,
// and up to TOKENS_PER_PASS tokens share each decoded group.
#extension GL_GOOGLE_include_directive : require
#if defined(USE_SUBGROUP)
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#endif

#define WG_SIZE 64u
#define ROWS_PER_WG 2u
#define TOKENS_PER_PASS 8u
#define N_SUMS (ROWS_PER_WG * TOKENS_PER_PASS)

layout(local_size_x = 64) in;

#include "common.glsl"
#include "dequant.glsl"

#if defined(USE_SUBGROUP)
// One partial sum per subgroup (subgroups are at least 4 lanes wide).
shared float partial[N_SUMS][WG_SIZE / 4u];
#else
shared float partial[N_SUMS][WG_SIZE];
#endif

void main() {
    uint row0 = workgroup_index() * ROWS_PER_WG;
    // Uniform across the workgroup, so the barriers below stay legal.
    if (row0 >= p.n_rows) {
        return;
    }
    uint tid = gl_LocalInvocationID.x;
    uint n_groups = p.n_in / 8u;
    uint x_stride4 = p.n_in / 4u;
    uint row_byte[ROWS_PER_WG];
    for (uint r = 0u; r < ROWS_PER_WG; r++) {
        row_byte[r] = min(row0 + r, p.n_rows - 1u) * p.row_stride;
    }

    for (uint t0 = 0u; t0 < p.n_tok; t0 += TOKENS_PER_PASS) {
        uint nt = min(TOKENS_PER_PASS, p.n_tok - t0);
        float acc[ROWS_PER_WG][TOKENS_PER_PASS];
        for (uint r = 0u; r < ROWS_PER_WG; r++) {
            for (uint t = 0u; t < TOKENS_PER_PASS; t++) {
                acc[r][t] = 0.0;
            }
        }
        for (uint g = tid; g < n_groups; g += WG_SIZE) {
            vec4 lo[ROWS_PER_WG];
            vec4 hi[ROWS_PER_WG];
            for (uint r = 0u; r < ROWS_PER_WG; r++) {
                dequant_group(row_byte[r], g, lo[r], hi[r]);
            }
            for (uint t = 0u; t < TOKENS_PER_PASS; t++) {
                if (t < nt) {
                    uint xi = (t0 + t) * x_stride4 + 2u * g;
                    vec4 xl = x[xi];
                    vec4 xh = x[xi + 1u];
                    for (uint r = 0u; r < ROWS_PER_WG; r++) {
                        acc[r][t] += dot(lo[r], xl) + dot(hi[r], xh);
                    }
                }
            }
        }

#if defined(USE_SUBGROUP)
        for (uint r = 0u; r < ROWS_PER_WG; r++) {
            for (uint t = 0u; t < TOKENS_PER_PASS; t++) {
                float s = subgroupAdd(acc[r][t]);
                if (subgroupElect()) {
                    partial[r * TOKENS_PER_PASS + t][gl_SubgroupID] = s;
                }
            }
        }
        uint n_partials = gl_NumSubgroups;
#else
        for (uint r = 0u; r < ROWS_PER_WG; r++) {
            for (uint t = 0u; t < TOKENS_PER_PASS; t++) {
                partial[r * TOKENS_PER_PASS + t][tid] = acc[r][t];
            }
        }
        uint n_partials = WG_SIZE;
#endif
        barrier();
        if (tid < N_SUMS) {
            uint r = tid / TOKENS_PER_PASS;
            uint t = tid % TOKENS_PER_PASS;
            if (row0 + r < p.n_rows && t < nt) {
                float s = 0.0;
                for (uint i = 0u; i < n_partials; i++) {
                    s += partial[tid][i];
                }
                y[(t0 + t) * p.y_stride + p.y_offset + row0 + r] = s;
            }
        }
        barrier();
    }
}
