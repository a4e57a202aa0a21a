#version 450
// Matrix-vector products on int8 activations, for the quantised types (those
// with decode_codes in matvec_units.glsl). The float kernel (matvec.comp)
// spends most of its instructions turning codes into floats and multiplying
// them one by one, which caps it well below the memory roof; here every four
// codes meet four int8 activations in one packed dot product
// (SPV_KHR_integer_dot_product, shaderIntegerDotProduct).
//
// Each pass over NT tokens first quantises their x into shared memory, in
// blocks of 32 values with one scale d = max|x| / 127 (the blocks of the CPU
// kernels' Q8_0/Q8_1 activations, so that both round alike), and keeps
// d * (sum of the block's quants) per 16 values: a run of 16 weights adds
//     scale * d * dot(codes, xq) + (minv - scale * CODE_OFFSET) * d * sum(xq),
// which is exactly the dequantised weights times the quantised activations.
// (Blocks of 16 measured further from the CPU's logits, 6.2% against 5.1%
// of max |logit| on SmolLM2, though each block is finer.)
// With X_PREQUANTISED, x arrives already quantised that way (int8_acts.glsl,
// written by the norm before the matvec) and the pass only copies it into
// shared memory: the quantisation is then done once per token, not once
// per workgroup.
// The weight loop, the workgroup shape and the reduction are those of
// matvec.comp (same units, same specialisation constants 0-3); constant 4 is
// n_in / 16, which sizes the shared activations.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_spirv_intrinsics : require

layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint ROWS = 4;
layout(constant_id = 2) const uint NT = 1;
layout(constant_id = 3) const uint UNROLL = 1;
layout(constant_id = 4) const uint IN_VEC4 = 16;
layout(local_size_x_id = 0) in;

#define USE_SUBGROUP 1
#include "common.glsl"
layout(std430, binding = 0) readonly buffer Weights4 { uvec4 w4[]; };
#include "dequant.glsl"
#include "matvec_units.glsl"
#include "matvec_reduce.glsl"

// OpSUDot with the 4x8-bit packed format: the signed bytes of a times the
// unsigned bytes of b, summed.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int dot_i8_u8(uint a, uint b, spirv_literal int packed_format);
const int PACKED_4X8 = 0;

// Per token: the quants (16 per uvec4), the scale of each 32 values and
// d * (sum of quants) of each 16.
#if !defined(X_PREQUANTISED)
shared uvec4 xq[NT * IN_VEC4];
shared float xd[NT * IN_VEC4 / 2u];
shared float xs[NT * IN_VEC4];
#endif

#if defined(X_PREQUANTISED)
#include "int8_acts.glsl"
layout(std430, binding = 1) readonly buffer XQ { uvec4 x_int8[]; };
layout(std430, binding = 1) readonly buffer XQF { float x_int8_f[]; };

// Nothing to prepare: the runs read the quantised x straight from memory
// (16 bytes of quants where the float kernel reads 64 of x), so no barrier
// holds the weight loads back.
void load_x(uint t0) {}

// The quants (16 values from value 16 * v16), their scale and d * sum.
void x_run(uint t, uint v16, out uvec4 q, out float d, out float s) {
    uint n = p.n_in;
    uint base = min(t, p.n_tok - 1u) * int8_token_vec4s(n);
    uint scales = base + int8_quant_vec4s(n);
    uint sums = scales + int8_scale_vec4s(n);
    q = x_int8[base + v16];
    d = x_int8_f[4u * scales + v16 / 2u];
    s = x_int8_f[4u * sums + v16];
}
#else
// Quantises the x of tokens t0 .. t0 + NT - 1 (past the end: the last token).
void load_x(uint t0) {
    uint blocks = p.n_in / 32u;
    for (uint i = gl_LocalInvocationID.x; i < NT * blocks; i += WG) {
        uint t = i / blocks;
        uint b = i % blocks;
        uint src = min(t0 + t, p.n_tok - 1u) * (p.n_in / 4u) + 8u * b;
        vec4 v[8];
        float amax = 0.0;
        for (uint k = 0u; k < 8u; k++) {
            v[k] = x[src + k];
            vec4 a = abs(v[k]);
            amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
        }
        float d = amax / 127.0;
        float id = amax > 0.0 ? 127.0 / amax : 0.0;
        uint words[8];
        int sums[2] = int[2](0, 0);
        for (uint k = 0u; k < 8u; k++) {
            ivec4 q = ivec4(round(v[k] * id));
            sums[k / 4u] += (q.x + q.y) + (q.z + q.w);
            uvec4 u = uvec4(q) & 0xFFu;
            words[k] = u.x | (u.y << 8) | (u.z << 16) | (u.w << 24);
        }
        uint dst = t * IN_VEC4 + 2u * b;
        xq[dst] = uvec4(words[0], words[1], words[2], words[3]);
        xq[dst + 1u] = uvec4(words[4], words[5], words[6], words[7]);
        xd[t * (IN_VEC4 / 2u) + b] = d;
        xs[dst] = d * float(sums[0]);
        xs[dst + 1u] = d * float(sums[1]);
    }
}

void x_run(uint t, uint v16, out uvec4 q, out float d, out float s) {
    uint at = (t % NT) * IN_VEC4 + v16;
    q = xq[at];
    d = xd[at / 2u];
    s = xs[at];
}
#endif

// An int of magnitude < 2^22 as a float, without a conversion instruction
// (a run's dot is at most 16 * 255 * 127).
float int_float(int v) {
    return intBitsToFloat(v + 0x4B400000) - 12582912.0;
}

// Loads units u0, u0 + WG, ... (UNROLL of them) of every row; units past the
// end reload u0 (skipped when computing).
void load_units(out Unit un[UNROLL][ROWS], uint row_byte[ROWS], uint u0, uint n_units) {
    for (uint i = 0u; i < UNROLL; i++) {
        uint u = u0 + i * WG < n_units ? u0 + i * WG : u0;
        for (uint r = 0u; r < ROWS; r++) {
            un[i][r] = load_unit(row_byte[r], u);
        }
    }
}

void main() {
    uint row0 = workgroup_index() * ROWS;
    // Uniform across the workgroup, so the barriers below stay legal.
    if (row0 >= p.n_rows) {
        return;
    }
    uint tid = gl_LocalInvocationID.x;
    uint n_units = p.n_in / UNIT_VALUES;
    uint row_byte[ROWS];
    for (uint r = 0u; r < ROWS; r++) {
        // Rows past the end read the last row; their sums are never written.
        row_byte[r] = min(row0 + r, p.n_rows - 1u) * p.row_stride;
    }

    for (uint t0 = 0u; t0 < p.n_tok; t0 += NT) {
        load_x(t0);
#if !defined(X_PREQUANTISED)
        barrier();
#endif
        clear_sums();
        for (uint u0 = tid; u0 < n_units; u0 += UNROLL * WG) {
            // All loads of UNROLL units first, so that they are in flight together.
            Unit un[UNROLL][ROWS];
            load_units(un, row_byte, u0, n_units);
            for (uint i = 0u; i < UNROLL; i++) {
                uint u = u0 + i * WG;
                if (u >= n_units) {
                    break;
                }
                for (uint run = 0u; run < RUNS; run++) {
                    uvec4 codes[ROWS];
                    float scale[ROWS];
                    float offset[ROWS];
                    for (uint r = 0u; r < ROWS; r++) {
                        float minv;
                        decode_codes(un[i][r], run, codes[r], scale[r], minv);
                        offset[r] = minv - scale[r] * CODE_OFFSET;
                    }
                    // The run's 16 values: one uvec4 of quants, half a scale block.
                    uint xv = run_x4(u, run) / 4u;
                    for (uint t = 0u; t < NT; t++) {
                        uvec4 q;
                        float d;
                        float s;
                        x_run(t0 + t, xv, q, d, s);
                        for (uint r = 0u; r < ROWS; r++) {
                            int idot = dot_i8_u8(q.x, codes[r].x, PACKED_4X8)
                                    + dot_i8_u8(q.y, codes[r].y, PACKED_4X8)
                                    + dot_i8_u8(q.z, codes[r].z, PACKED_4X8)
                                    + dot_i8_u8(q.w, codes[r].w, PACKED_4X8);
                            acc[r][t] += scale[r] * (d * int_float(idot)) + offset[r] * s;
                        }
                    }
                }
            }
        }
        store_sums(row0, t0);
    }
}
