// The int8-activation matvec of decode batches for Q4_K and Q6_K on f16
// matrix fragments: 16 x 8 x 16 products of the dequantised weights (A,
// f16) and x (B, f16) with f32 accumulators that run over the whole row.
// matvec_i8mm.comp includes it for those two types; the others stage int8
// fragments (matvec_i8mm_staged.glsl).

// An int8 form of these products multiplies codes by int8 x and must read
// every product back to scale it per 32-value block, passing A through
// shared memory (on the H200 123-184 registers, B = 8 llama-8b 1293 tok/s
// against 1431-1476 with this form's 50; docs/BENCHMARKS.md). Here the
// weights' scales and mins and x's block scales are applied to the
// elements before the product, so the fragments' sums need no per-block work and A is built in registers from
// the invocation's own code words: no shared memory and no barrier until
// the subgroups' sums meet.
//
// The layout is the one the H200's driver gives 16 x 8 x 16 f16 products
// (read back from coopMatLoad of index matrices; g = lane / 4, t = lane %
// 4):
//   A (16 x 16): element e is row g + 8 (e / 4), column 2t + e % 2
//                + 8 ((e / 2) % 2);
//   B (16 x 8):  element e is row 2t + e % 2 + 8 (e / 2), column (token) g;
//   C (16 x 8):  element e is row g + 8 (e / 2), token 2t + e % 2.
// Each workgroup checks it once against matrices of element indices it
// loads (a mismatch turns its outputs into NaN, which the open-time check,
// int8_matrix.rs `layout_holds`, catches); EMULATE_COOPMAT keeps the same
// layout with the products in plain code and f16 rounding emulated in f32.

// A 32-value block is two products (halves hf = 0, 1). An invocation holds
// the block's values 8t .. 8t + 7 of its rows (one 8-byte load of codes,
// and of x), half hf the four values 8t + 4hf ..: its column pairs (2t,
// 2t + 1) and (2t + 8, 2t + 9) hold values (0, 2) and (1, 3) of them, the
// pairs that two masks of one code word give as f16 bit patterns. B's rows
// follow the same permutation.
//
// A subgroup owns RF fragments of 16 rows x TN tokens and every WARPS-th
// super-block of them; per row fragment and half it keeps one accumulator,
// added at the end, and the subgroups' sums meet in shared memory in
// subgroup order, so a token's sums do not depend on the batch.

const uint SB_VALUES = 256u;
// Elements of a C fragment per invocation.
const uint ELEMS = 4u;

layout(std430, binding = 0) readonly buffer Weights2 { uvec2 w2[]; };
layout(std430, binding = 1) readonly buffer XQ2 { uvec2 x_int8_2[]; };
#if defined(X_F16)
layout(std430, binding = 1) readonly buffer XH { uvec4 x_h[]; };
#endif

// This kernel checks the element layout itself (layout_matches, NaN
// outputs on a mismatch): its open-time check (int8_matrix.rs
// `layout_holds`) multiplies zeros, so it can only see NaN.
#define FRAG16_LAYOUT_PROBE
#include "frag16.glsl"

// The weight words of row slot h (2 per row fragment: rows g and g + 8):
// with GATE_UP the up weights for the fragments from MATRIX_FRAGS on.
// h is a constant wherever the loops are unrolled, so only one load is
// issued.
uvec4 weights4(uint h, uint i) {
#if defined(GATE_UP)
    if (h / 2u >= MATRIX_FRAGS) {
        return up_w4[i];
    }
#endif
    return w4[i];
}
uvec2 weights2(uint h, uint i) {
#if defined(GATE_UP)
    if (h / 2u >= MATRIX_FRAGS) {
        return up_w2[i];
    }
#endif
    return w2[i];
}

// Where token `tok`'s scale d of block `blk` is, in floats.
uint x_scale_at(uint tok, uint blk) { return 4u * int8_scales_vec4(tok, p.n_in) + blk; }

// Values 8t .. 8t + 7 of block blk of token tok as B's pairs of each half
// hf (x02[hf], x13[hf]); zero where the turn is not live. With X_F16, x
// arrives in f16 (token tok from half tok * n_in, as the cooperative
// prefill kernel reads it): one 16-byte load and two byte permutations
// per half instead of the int8 quants' conversion and scaling (on the H200
// the batched llama-8b step -6%, docs/BENCHMARKS.md).
void x_block(uint tok, uint blk, bool live, uint n_x2, uint t, out H2 x02[2], out H2 x13[2]) {
#if defined(X_F16)
    uvec4 w = x_h[tok * (p.n_in / 8u) + 4u * blk + t];
    if (!live) {
        w = uvec4(0u);
    }
    [[unroll]] for (uint hf = 0u; hf < 2u; hf++) {
        uint lo = w[2u * hf];
        uint hi = w[2u * hf + 1u];
        x02[hf] = h2_bits((lo & 0xFFFFu) | (hi << 16));
        x13[hf] = h2_bits((lo >> 16) | (hi & 0xFFFF0000u));
    }
#else
    uvec2 xq = x_int8_2[tok * n_x2 + 4u * blk + t];
    H1 xd = h1(live ? x_int8_f[x_scale_at(tok, blk)] : 0.0);
    [[unroll]] for (uint hf = 0u; hf < 2u; hf++) {
        x_pairs(xq[hf], xd, x02[hf], x13[hf]);
    }
#endif
}

#include "frag16_pairs.glsl"

void main() {
    uint tid = gl_LocalInvocationIndex;
    uint warp = tid / LANES;
    uint lane = tid % LANES;
    uint g = lane / 4u;
    uint t = lane % 4u;
    uint row0 = workgroup_index() * OUT_ROWS;
    uint n_sb = p.n_in / SB_VALUES;
    // Every subgroup runs the same number of turns (the emulation's
    // barriers are the workgroup's); a turn past the last super-block
    // repeats that one with x's scales zero.
    uint turns = (n_sb + WARPS - 1u) / WARPS;
#if !defined(EMULATE_COOPMAT)
    bool layout_ok = layout_matches();
#endif
    // Per row fragment f, rows g and g + 8 of it: row_byte[2 f + h] (past
    // the end: the last row; their sums are never written). With GATE_UP
    // the fragments from MATRIX_FRAGS on take the same rows of up.
    uint row_byte[2u * RF];
    [[unroll]] for (uint i = 0u; i < 2u * RF; i++) {
        uint row = row0 + TM * ((i / 2u) % MATRIX_FRAGS) + g + 8u * (i % 2u);
        row_byte[i] = min(row, p.n_rows - 1u) * p.row_stride;
    }
    uint n_x2 = 2u * int8_token_vec4s(p.n_in);

    for (uint t0 = 0u; t0 < p.n_tok; t0 += TN) {
        // B's token (column g), clamped to the batch.
        uint tok_b = min(t0 + g, p.n_tok - 1u);
        // acc[2 f + hf]: row fragment f, half hf of each block.
        C_FRAG acc[2u * RF];
        [[unroll]] for (uint i = 0u; i < 2u * RF; i++) {
            acc[i] = c_zero();
        }
        for (uint turn = 0u; turn < turns; turn++) {
            uint sb = min(turn * WARPS + warp, n_sb - 1u);
            bool live = turn * WARPS + warp < n_sb;
#if defined(TYPE_Q4_K)
            // Per row: the block head and, per 64-value chunk c, the eight
            // code bytes 8t.. of qs[32c ..] (low nibbles: block 2c, high:
            // block 2c + 1).
            uvec4 head[2u * RF];
            uvec2 qs[2u * RF][4];
            [[unroll]] for (uint h = 0u; h < 2u * RF; h++) {
                uint base = row_byte[h] + sb * BLOCK_BYTES;
                head[h] = weights4(h, base / 16u);
                [[unroll]] for (uint c = 0u; c < 4u; c++) {
                    qs[h][c] = weights2(h, (base + QS_OFFSET + 32u * c) / 8u + t);
                }
            }
            [[unroll]] for (uint c = 0u; c < 4u; c++) {
                // Per row the scales and mins of blocks 2c and 2c + 1.
                H2 scale[2u * RF][2];
                H2 minv[2u * RF][2];
                [[unroll]] for (uint h = 0u; h < 2u * RF; h++) {
                    vec2 dd = unpackHalf2x16(head[h].x);
                    vec4 sm = q4k_scales_mins(head[h], c);
                    scale[h][0] = H2(h1(dd.x * sm.x));
                    scale[h][1] = H2(h1(dd.x * sm.y));
                    minv[h][0] = H2(h1(dd.y * sm.z));
                    minv[h][1] = H2(h1(dd.y * sm.w));
                }
                [[unroll]] for (uint hn = 0u; hn < 2u; hn++) {
                    uint blk = 8u * sb + 2u * c + hn;
                    H2 x02[2];
                    H2 x13[2];
                    x_block(tok_b, blk, live, n_x2, t, x02, x13);
                    [[unroll]] for (uint hf = 0u; hf < 2u; hf++) {
                        B_FRAG b = make_b(x02[hf], x13[hf]);
                        [[unroll]] for (uint f = 0u; f < RF; f++) {
                            H2 g02;
                            H2 g13;
                            H2 h02;
                            H2 h13;
                            uint lo = 2u * f;
                            uint hi = 2u * f + 1u;
                            q4_pairs(qs[lo][c][hf], 4u * hn, scale[lo][hn], minv[lo][hn], g02, g13);
                            q4_pairs(qs[hi][c][hf], 4u * hn, scale[hi][hn], minv[hi][hn], h02, h13);
                            acc[2u * f + hf] = PRODUCT(make_a(g02, g13, h02, h13), b, acc[2u * f + hf]);
                        }
                    }
                }
            }
#elif defined(TYPE_Q6_K)
            // Per row and half n: the code bytes 8t.. of ql[64n ..] and
            // ql[64n + 32 ..] (low nibbles: quarters 0 and 1, high: 2 and
            // 3), of qh[32n ..] (two bits per quarter), the 16 int8 scales
            // and d.
            uvec2 ql[2u * RF][2][2];
            uvec2 qh[2u * RF][2];
            uvec4 scales[2u * RF];
            float d[2u * RF];
            [[unroll]] for (uint h = 0u; h < 2u * RF; h++) {
                uint base = row_byte[h] + sb * Q6_BODY_BYTES;
                [[unroll]] for (uint n = 0u; n < 2u; n++) {
                    ql[h][n][0] = w2[(base + 64u * n) / 8u + t];
                    ql[h][n][1] = w2[(base + 64u * n + 32u) / 8u + t];
                    qh[h][n] = w2[(base + 128u + 32u * n) / 8u + t];
                }
                scales[h] = w4[(base + 192u) / 16u];
                d[h] = load_f16(row_byte[h] + Q6_BODY_BYTES * blocks_per_row() + 2u * sb);
            }
            // This invocation's values 8t .. 8t + 7 of a 32-value block lie
            // in its second 16-value scale when t >= 2.
            uint second_half = t / 2u;
            [[unroll]] for (uint n = 0u; n < 2u; n++) {
                [[unroll]] for (uint qq = 0u; qq < 4u; qq++) {
                    uint blk = 8u * sb + 4u * n + qq;
                    H2 x02[2];
                    H2 x13[2];
                    x_block(tok_b, blk, live, n_x2, t, x02, x13);
                    // Per row its scale of these eight values.
                    H2 scale[2u * RF];
                    [[unroll]] for (uint h = 0u; h < 2u * RF; h++) {
                        uint s = 8u * n + 2u * qq + second_half;
                        float sc = sbyte_float((scales[h][s / 4u] >> (8u * (s % 4u))) & 0xFFu);
                        scale[h] = H2(h1(d[h] * sc));
                    }
                    [[unroll]] for (uint hf = 0u; hf < 2u; hf++) {
                        B_FRAG b = make_b(x02[hf], x13[hf]);
                        [[unroll]] for (uint f = 0u; f < RF; f++) {
                            H2 pairs[2][2];
                            [[unroll]] for (uint r = 0u; r < 2u; r++) {
                                uint h = 2u * f + r;
                                uint l4 = ql[h][n][qq & 1u][hf];
                                uint code = ((l4 >> (4u * (qq >> 1u))) & 0x0F0F0F0Fu)
                                    | (((qh[h][n][hf] >> (2u * qq)) & 0x03030303u) << 4);
                                q6_pairs(code, scale[h], pairs[r][0], pairs[r][1]);
                            }
                            acc[2u * f + hf] = PRODUCT(
                                make_a(pairs[0][0], pairs[0][1], pairs[1][0], pairs[1][1]), b,
                                acc[2u * f + hf]);
                        }
                    }
                }
            }
#endif
        }
        // The subgroups' sums, added in subgroup order.
        [[unroll]] for (uint f = 0u; f < RF; f++) {
            [[unroll]] for (uint e = 0u; e < ELEMS; e++) {
                float v = acc[2u * f][e] + acc[2u * f + 1u][e];
#if !defined(EMULATE_COOPMAT)
                if (!layout_ok) {
                    v = uintBitsToFloat(0x7FC00000u);
                }
#endif
                sh_sum[(warp * WG_ROWS + TM * f + g + 8u * (e / 2u)) * TN + 2u * t + e % 2u] = v;
            }
        }
#if defined(GATE_UP)
        store_act_pass(row0, t0);
#else
        store_pass_sums(row0, t0);
#endif
    }
}
