#version 450
// Tiled matrix-matrix product for many tokens (prefill): each workgroup
// computes a TILE_ROWS x TILE_TOKENS block of y. Per step of TILE_K values it
// decodes the weight tile and stages the x tile in shared memory; every
// thread then accumulates 8 rows x 4 tokens in registers.
#extension GL_GOOGLE_include_directive : require

#define TILE_ROWS 128u
#define TILE_TOKENS 64u
#define TILE_K 32u
#define THREADS 256u

layout(local_size_x = 256) in;

#include "common.glsl"
#include "dequant.glsl"

// a_tile[k][q] holds rows 4q .. 4q+3 at depth k; b_tile[k][q] tokens 4q .. 4q+3.
shared vec4 a_tile[TILE_K][TILE_ROWS / 4u];
shared vec4 b_tile[TILE_K][TILE_TOKENS / 4u];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint row0 = gl_WorkGroupID.x * TILE_ROWS;
    uint tok0 = gl_WorkGroupID.y * TILE_TOKENS;
    uint x_stride4 = p.n_in / 4u;
    // Thread (tr, tc) owns rows 4tr.. and 64+4tr.. and tokens 4tc..
    uint tr = tid % 16u;
    uint tc = tid / 16u;

    vec4 acc_lo[4];
    vec4 acc_hi[4];
    for (uint j = 0u; j < 4u; j++) {
        acc_lo[j] = vec4(0.0);
        acc_hi[j] = vec4(0.0);
    }

    for (uint k0 = 0u; k0 < p.n_in; k0 += TILE_K) {
        // Weight tile: TILE_ROWS rows x 4 groups of 8 values, two groups per thread.
        for (uint i = 0u; i < 2u; i++) {
            uint task = tid + i * THREADS;
            uint r = task / 4u;
            uint kg = task % 4u;
            // Rows past the end read the last row; their results are never written.
            uint row = min(row0 + r, p.n_rows - 1u);
            vec4 lo;
            vec4 hi;
            dequant_group(row * p.row_stride, k0 / 8u + kg, lo, hi);
            for (uint c = 0u; c < 4u; c++) {
                a_tile[kg * 8u + c][r / 4u][r % 4u] = lo[c];
                a_tile[kg * 8u + 4u + c][r / 4u][r % 4u] = hi[c];
            }
        }
        // Input tile: TILE_TOKENS tokens x TILE_K values, two vec4 per thread.
        for (uint i = 0u; i < 2u; i++) {
            uint task = tid + i * THREADS;
            uint n = task / 8u;
            uint k4 = task % 8u;
            vec4 v = vec4(0.0);
            if (tok0 + n < p.n_tok) {
                v = x[(tok0 + n) * x_stride4 + k0 / 4u + k4];
            }
            for (uint c = 0u; c < 4u; c++) {
                b_tile[k4 * 4u + c][n / 4u][n % 4u] = v[c];
            }
        }
        barrier();
        // Each step's products are summed on their own before joining the
        // running total: one long chain of f32 additions over n_in values
        // loses several bits on wide rows (measured on 1536-wide rows).
        vec4 step_lo[4];
        vec4 step_hi[4];
        for (uint j = 0u; j < 4u; j++) {
            step_lo[j] = vec4(0.0);
            step_hi[j] = vec4(0.0);
        }
        for (uint k = 0u; k < TILE_K; k++) {
            vec4 a0 = a_tile[k][tr];
            vec4 a1 = a_tile[k][16u + tr];
            vec4 b = b_tile[k][tc];
            for (uint j = 0u; j < 4u; j++) {
                step_lo[j] += a0 * b[j];
                step_hi[j] += a1 * b[j];
            }
        }
        for (uint j = 0u; j < 4u; j++) {
            acc_lo[j] += step_lo[j];
            acc_hi[j] += step_hi[j];
        }
        barrier();
    }

    for (uint j = 0u; j < 4u; j++) {
        uint t = tok0 + tc * 4u + j;
        if (t >= p.n_tok) {
            break;
        }
        uint base = t * p.y_stride + p.y_offset;
        for (uint c = 0u; c < 4u; c++) {
            uint r_lo = row0 + tr * 4u + c;
            uint r_hi = r_lo + 64u;
            if (r_lo < p.n_rows) {
                store_y(base + r_lo, acc_lo[j][c]);
            }
            if (r_hi < p.n_rows) {
                store_y(base + r_hi, acc_hi[j][c]);
            }
        }
    }
}
