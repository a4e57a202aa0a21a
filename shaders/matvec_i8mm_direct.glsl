// The int8 matvec on the matrix units for Q4_K and Q6_K, without staging
// rounds (included by matvec_i8mm.comp).
//
// The staged kernel (matvec_i8mm_staged.glsl) fetches a whole step into
// registers, stages it into shared memory in rounds between subgroup
// barriers, then loads fragments and the scales back from there. Here each
// invocation loads the eight code bytes of a block it needs for each of its
// two rows, and:
//   - builds its B elements (x) and scales its C elements in registers, from
//     the implementation's element layout of those two;
//   - passes A through a small tile of its own subgroup: its four code
//     words stored, one subgroup barrier, one fragment load (writing the
//     sixteen int8 elements one by one measured slower on the H200: Q4_K /
//     Q6_K 4096 x 14336 26.2 / 43.0 us against 22.5 / 27.9 through the tile).
//
// The layout is that of a 16 x 8 x 32 s8 product on NVIDIA's matrix units
// (g = lane / 4, t = lane % 4):
//   B (32 x 8):  element 4q + j is row 4 (t + 4 q) + j, column (token) g;
//   C (16 x 8):  element e is row g + 8 (e / 2), token 2t + e % 2.
// Each workgroup checks it once against the matrices of element indices it
// loads (a mismatch turns its outputs into NaN: loud, as the staged
// kernel's check), and EMULATE_COOPMAT keeps the same layout with the
// products in plain code, so everything but the products runs on any device.
//
// A fragment's 32 columns may be any permutation of a block's 32 values, as
// long as B's rows follow the same one: column quad c holds value quad
// 2 (c % 4) + c / 4, so that an invocation's two quads of a row (columns
// 4t.. and 4t + 16..) are the block's values 8t .. 8t + 7, one 8-byte load
// of codes, and its B quads the same eight bytes of x.
//
// A subgroup owns RF fragments of 16 rows (the workgroup's 16 RF rows) x TN
// tokens and every WARPS-th super-block of them (256 values: eight blocks
// of 32, each one product per row fragment against the same x fragment;
// Q6_K, whose scales cover 16 values, multiplies each block twice, each
// fragment holding one half and zeros in the other). Each invocation scales the
// elements it holds per block:
//     acc(r, t) = fma(minv'(r), s(t), fma(scale(r) * d(t), dot(r, t), acc(r, t)))
// (the staged kernel's terms: d x's block scale, s its d * sum), so a
// token's sums run in the same order whatever the batch. The subgroups'
// sums meet in shared memory in subgroup order.

// TN (tokens per pass) is 8 here, the N of the layout above: int8_matrix.rs
// gives these types no other width.
const uint SB_VALUES = 256u;
// Elements of a C fragment per invocation.
const uint ELEMS = 4u;
#if defined(TYPE_Q6_K)
const uint FRAGS = 2u;
#else
const uint FRAGS = 1u;
#endif

layout(std430, binding = 0) readonly buffer Weights2 { uvec2 w2[]; };
layout(std430, binding = 1) readonly buffer XQ2 { uvec2 x_int8_2[]; };
layout(std430, binding = 1) readonly buffer XQF2 { vec2 x_int8_f2[]; };
layout(std430, binding = 1) readonly buffer XQF4 { vec4 x_int8_f4[]; };

#if defined(EMULATE_COOPMAT)
// Per subgroup the fragments as quads: A [frag][row][column quad], B
// [token][row quad].
shared uint sh_ea[WARPS * FRAGS * TM * 8u];
shared uint sh_eb[WARPS * 8u * 8u];
#define A_FRAG uint[16]
#define B_FRAG uint[8]
#else
// The element-index matrices of the layout check: B's rows and columns
// (8 columns of 32 bytes) and C's element numbers (row-major ints).
shared uvec4 sh_probe_b[2u * 8u * 2u];
shared int sh_probe_c[TM * 8u];
#define A_FRAG coopmat<int8_t, gl_ScopeSubgroup, TM, 32, gl_MatrixUseA>
#define B_FRAG coopmat<int8_t, gl_ScopeSubgroup, 32, 8, gl_MatrixUseB>
#define C_FRAG coopmat<int32_t, gl_ScopeSubgroup, TM, 8, gl_MatrixUseAccumulator>
#endif

// An int of magnitude < 2^22 as a float, without a conversion instruction.
float int_float(int v) {
    return intBitsToFloat(v + 0x4B400000) - 12582912.0;
}

#if !defined(EMULATE_COOPMAT)
// Per subgroup four A tiles of 16 rows x 48 bytes (32 values, padded so
// that the eight rows of one store hit distinct banks), used in turn: a tile
// is written again only after another call's barrier, when every load from
// it is done.
shared uint sh_at[WARPS * 4u * TM * 12u];
// Fragment A from this invocation's code words: lo = row g, hi = row g + 8,
// .x its first quad of the row (values 8t..: columns 4t..), .y the second
// (columns 16 + 4t..), through tile `slot`.
A_FRAG make_a_slot(uvec2 lo, uvec2 hi, uint slot) {
    uint lane = gl_LocalInvocationIndex % LANES;
    uint warp = gl_LocalInvocationIndex / LANES;
    uint g = lane / 4u;
    uint t = lane % 4u;
    uint base = (warp * 4u + slot % 4u) * TM * 12u;
    sh_at[base + g * 12u + t] = lo.x;
    sh_at[base + g * 12u + 4u + t] = lo.y;
    sh_at[base + (g + 8u) * 12u + t] = hi.x;
    sh_at[base + (g + 8u) * 12u + 4u + t] = hi.y;
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    A_FRAG a;
    coopMatLoad(a, sh_at, base, 12, gl_CooperativeMatrixLayoutRowMajor);
    return a;
}
#define MAKE_A(lo, hi, slot) make_a_slot(lo, hi, slot)
#else
// The emulation's A: the four code words as quads, quad q at row g + 8 (q /
// 2), column quad t + 4 (q % 2), as the tile above holds them.
A_FRAG make_a(uvec2 lo, uvec2 hi) {
    A_FRAG a;
    uint words[4] = uint[4](lo.x, lo.y, hi.x, hi.y);
    [[unroll]] for (uint q = 0u; q < 4u; q++) {
        [[unroll]] for (uint j = 0u; j < 4u; j++) {
            a[4u * q + j] = words[q];
        }
    }
    return a;
}
#define MAKE_A(lo, hi, slot) make_a(lo, hi)
#endif

B_FRAG make_b(uvec2 xq) {
    B_FRAG b;
    [[unroll]] for (uint q = 0u; q < 2u; q++) {
        uint word = q == 0u ? xq.x : xq.y;
#if !defined(EMULATE_COOPMAT)
        i8vec4 bytes = unpack8(int(word));
#endif
        [[unroll]] for (uint j = 0u; j < 4u; j++) {
#if defined(EMULATE_COOPMAT)
            b[4u * q + j] = word;
#else
            b[4u * q + j] = bytes[j];
#endif
        }
    }
    return b;
}

#if defined(EMULATE_COOPMAT)
int dot4_bytes(uint a, uint b) {
    int s = 0;
    [[unroll]] for (uint k = 0u; k < 32u; k += 8u) {
        s += bitfieldExtract(int(a), int(k), 8) * bitfieldExtract(int(b), int(k), 8);
    }
    return s;
}

// The product of fragments a (fragment slot f) and b in plain code: each
// invocation stores its quads into the subgroup's tiles (barriers of the
// whole workgroup: every subgroup calls it equally often), then sums its
// four elements from them.
int[ELEMS] emulated_product(A_FRAG a, B_FRAG b, uint f) {
    uint lane = gl_LocalInvocationIndex % LANES;
    uint warp = gl_LocalInvocationIndex / LANES;
    uint g = lane / 4u;
    uint t = lane % 4u;
    uint ab = (warp * FRAGS + f) * TM * 8u;
    uint bb = warp * 64u;
    [[unroll]] for (uint q = 0u; q < 4u; q++) {
        sh_ea[ab + (g + 8u * (q / 2u)) * 8u + t + 4u * (q % 2u)] = a[4u * q];
    }
    [[unroll]] for (uint q = 0u; q < 2u; q++) {
        sh_eb[bb + g * 8u + t + 4u * q] = b[4u * q];
    }
    barrier();
    int c[ELEMS];
    [[unroll]] for (uint e = 0u; e < ELEMS; e++) {
        uint r = g + 8u * (e / 2u);
        uint tok = 2u * t + e % 2u;
        int s = 0;
        for (uint k = 0u; k < 8u; k++) {
            s += dot4_bytes(sh_ea[ab + r * 8u + k], sh_eb[bb + tok * 8u + k]);
        }
        c[e] = s;
    }
    barrier();
    return c;
}
#define PRODUCT(a, b, f) emulated_product(a, b, f)
#define C_AT(c, e) c[e]
#define C_TYPE int[ELEMS]
#else
#define PRODUCT(a, b, f) coopMatMulAdd(a, b, C_FRAG(0))
#define C_AT(c, e) c[e]
#define C_TYPE C_FRAG

// Whether the implementation's layout is the one this kernel is written
// for (see the top of this file). Every invocation must call it (barrier).
bool layout_matches() {
    uint tid = gl_LocalInvocationIndex;
    // B's row (k) and column (token) of each byte, C's element number.
    for (uint i = tid; i < 8u * 32u / 4u; i += THREADS) {
        uint n = i / 8u;
        uint k0 = 4u * (i % 8u);
        uint ks = k0 | ((k0 + 1u) << 8) | ((k0 + 2u) << 16) | ((k0 + 3u) << 24);
        sh_probe_b[i / 4u][i % 4u] = ks;
        sh_probe_b[16u + i / 4u][i % 4u] = n * 0x01010101u;
    }
    for (uint i = tid; i < TM * 8u; i += THREADS) {
        sh_probe_c[i] = int(i);
    }
    barrier();
    B_FRAG b_k;
    B_FRAG b_n;
    C_FRAG c_i;
    coopMatLoad(b_k, sh_probe_b, 0, 2, gl_CooperativeMatrixLayoutColumnMajor);
    coopMatLoad(b_n, sh_probe_b, 16, 2, gl_CooperativeMatrixLayoutColumnMajor);
    coopMatLoad(c_i, sh_probe_c, 0, 8, gl_CooperativeMatrixLayoutRowMajor);
    uint lane = tid % LANES;
    uint g = lane / 4u;
    uint t = lane % 4u;
    bool ok = b_k.length() == 8 && c_i.length() == int(ELEMS);
    for (uint e = 0u; e < 8u && ok; e++) {
        ok = ok && uint(b_k[e]) == 4u * (t + 4u * (e / 4u)) + e % 4u && uint(b_n[e]) == g;
    }
    for (uint e = 0u; e < ELEMS && ok; e++) {
        ok = ok && uint(c_i[e]) == (g + 8u * (e / 2u)) * 8u + 2u * t + e % 2u;
    }
    return ok;
}
#endif

// Where token `tok`'s scales d and sums (d * sum of quants per 16 values)
// of block `blk` are, in floats.
uint x_scale_at(uint tok, uint blk) { return 4u * int8_scales_vec4(tok, p.n_in) + blk; }
uint x_sums_at(uint tok, uint blk) { return 4u * int8_sums_vec4(tok, p.n_in) + 2u * blk; }

void main() {
    uint tid = gl_LocalInvocationIndex;
    uint warp = tid / LANES;
    uint lane = tid % LANES;
    uint g = lane / 4u;
    uint t = lane % 4u;
    uint row0 = workgroup_index() * WG_ROWS;
    uint n_sb = p.n_in / SB_VALUES;
    // Every subgroup runs the same number of turns (the emulation's
    // barriers are the workgroup's); a turn past the last super-block
    // repeats that one and keeps nothing.
    uint turns = (n_sb + WARPS - 1u) / WARPS;
#if !defined(EMULATE_COOPMAT)
    bool layout_ok = layout_matches();
#endif
    // Per row fragment f, rows g and g + 8 of it: row_byte[2 f + h] (past
    // the end: the last row; their sums are never written).
    uint row_byte[2u * RF];
    [[unroll]] for (uint i = 0u; i < 2u * RF; i++) {
        row_byte[i] = min(row0 + TM * (i / 2u) + g + 8u * (i % 2u), p.n_rows - 1u) * p.row_stride;
    }
    uint n_x2 = 2u * int8_token_vec4s(p.n_in);

    for (uint t0 = 0u; t0 < p.n_tok; t0 += TN) {
        // B's token (column g) and C's two tokens, clamped to the batch.
        uint tok_b = min(t0 + g, p.n_tok - 1u);
        uint tok_c[2];
        tok_c[0] = min(t0 + 2u * t, p.n_tok - 1u);
        tok_c[1] = min(t0 + 2u * t + 1u, p.n_tok - 1u);
        // acc[ELEMS * f + e]: element e of row fragment f.
        float acc[ELEMS * RF];
        [[unroll]] for (uint e = 0u; e < ELEMS * RF; e++) {
            acc[e] = 0.0;
        }
        for (uint turn = 0u; turn < turns; turn++) {
            uint sb = min(turn * WARPS + warp, n_sb - 1u);
            bool live = turn * WARPS + warp < n_sb;
            // x per block: this invocation's 8 bytes for B (xq), the scales
            // and sums of C's two tokens (loaded where the blocks are
            // multiplied, which keeps the registers per invocation low),
            // shared by the RF row fragments.
#if defined(TYPE_Q4_K)
            // Per row: the block head and, per 64-value chunk c, the eight
            // code bytes 8t.. of qs[32c ..] (low nibbles: block 2c, high:
            // block 2c + 1).
            uvec4 head[2u * RF];
            uvec2 qs[2u * RF][4];
            [[unroll]] for (uint h = 0u; h < 2u * RF; h++) {
                uint base = row_byte[h] + sb * BLOCK_BYTES;
                head[h] = w4[base / 16u];
                [[unroll]] for (uint c = 0u; c < 4u; c++) {
                    qs[h][c] = w2[(base + QS_OFFSET + 32u * c) / 8u + t];
                }
            }
            vec2 dd[2u * RF];
            [[unroll]] for (uint h = 0u; h < 2u * RF; h++) {
                dd[h] = unpackHalf2x16(head[h].x);
            }
            [[unroll]] for (uint c = 0u; c < 4u; c++) {
                vec4 sm[2u * RF];
                [[unroll]] for (uint h = 0u; h < 2u * RF; h++) {
                    sm[h] = q4k_scales_mins(head[h], c);
                }
                // Blocks 2c and 2c + 1: x's quants, and per C token the two
                // scales and four sums.
                uint blk = 8u * sb + 2u * c;
                uvec2 xq[2];
                xq[0] = x_int8_2[tok_b * n_x2 + 4u * blk + t];
                xq[1] = x_int8_2[tok_b * n_x2 + 4u * (blk + 1u) + t];
                vec2 xd[2];
                vec4 xs[2];
                [[unroll]] for (uint k = 0u; k < 2u; k++) {
                    xd[k] = x_int8_f2[x_scale_at(tok_c[k], blk) / 2u];
                    xs[k] = x_int8_f4[x_sums_at(tok_c[k], blk) / 4u];
                }
                [[unroll]] for (uint hn = 0u; hn < 2u; hn++) {
                    B_FRAG b = make_b(xq[hn]);
                    [[unroll]] for (uint f = 0u; f < RF; f++) {
                        uvec2 lo = (qs[2u * f][c] >> (4u * hn)) & 0x0f0f0f0fu;
                        uvec2 hi = (qs[2u * f + 1u][c] >> (4u * hn)) & 0x0f0f0f0fu;
                        C_TYPE prod = PRODUCT(MAKE_A(lo, hi, (2u * c + hn) * RF + f), b, 0u);
                        [[unroll]] for (uint e = 0u; e < ELEMS; e++) {
                            uint h = 2u * f + e / 2u;
                            float scale = dd[h].x * (hn == 0u ? sm[h].x : sm[h].y);
                            float minv = -dd[h].y * (hn == 0u ? sm[h].z : sm[h].w);
                            float xdj = xd[e % 2u][hn];
                            float xsj = xs[e % 2u][2u * hn] + xs[e % 2u][2u * hn + 1u];
                            if (live) {
                                uint ai = ELEMS * f + e;
                                acc[ai] = fma(minv, xsj, fma(scale * xdj, int_float(C_AT(prod, e)), acc[ai]));
                            }
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
            // This invocation's values 8t .. 8t + 7 lie in the first half of
            // the block's two 16-value scales when t < 2.
            bool first_half = t < 2u;
            [[unroll]] for (uint n = 0u; n < 2u; n++) {
                [[unroll]] for (uint qq = 0u; qq < 4u; qq++) {
                    uint j = 4u * n + qq;
                    uint blk = 8u * sb + j;
                    B_FRAG b = make_b(x_int8_2[tok_b * n_x2 + 4u * blk + t]);
                    float xd[2];
                    vec2 xs[2];
                    [[unroll]] for (uint k = 0u; k < 2u; k++) {
                        xd[k] = x_int8_f[x_scale_at(tok_c[k], blk)];
                        xs[k] = x_int8_f2[x_sums_at(tok_c[k], blk) / 2u];
                    }
                    [[unroll]] for (uint f = 0u; f < RF; f++) {
                        uvec2 code[2];
                        [[unroll]] for (uint hh = 0u; hh < 2u; hh++) {
                            uint h = 2u * f + hh;
                            uvec2 l4 = ql[h][n][qq & 1u];
                            code[hh] = ((l4 >> (4u * (qq >> 1u))) & 0x0f0f0f0fu)
                                | (((qh[h][n] >> (2u * qq)) & 0x03030303u) << 4);
                        }
                        uvec2 zero = uvec2(0u);
                        uint slot = 2u * (j * RF + f);
                        C_TYPE p0 = PRODUCT(MAKE_A(first_half ? code[0] : zero, first_half ? code[1] : zero, slot), b, 0u);
                        C_TYPE p1 = PRODUCT(MAKE_A(first_half ? zero : code[0], first_half ? zero : code[1], slot + 1u), b, 1u);
                        [[unroll]] for (uint e = 0u; e < ELEMS; e++) {
                            uint h = 2u * f + e / 2u;
                            uint s0 = 8u * n + 2u * qq;
                            float sc0 = d[h] * sbyte_float((scales[h][s0 / 4u] >> (8u * (s0 % 4u))) & 0xFFu);
                            float sc1 = d[h] * sbyte_float((scales[h][s0 / 4u] >> (8u * (s0 % 4u) + 8u)) & 0xFFu);
                            float xdj = xd[e % 2u];
                            if (live) {
                                uint ai = ELEMS * f + e;
                                float a = fma(sc0 * xdj, int_float(C_AT(p0, e)), acc[ai]);
                                a = fma(-32.0 * sc0, xs[e % 2u].x, a);
                                a = fma(sc1 * xdj, int_float(C_AT(p1, e)), a);
                                acc[ai] = fma(-32.0 * sc1, xs[e % 2u].y, a);
                            }
                        }
                    }
                }
            }
#endif
        }
        // The subgroups' sums, added in subgroup order.
        [[unroll]] for (uint f = 0u; f < RF; f++) {
            [[unroll]] for (uint e = 0u; e < ELEMS; e++) {
                float v = acc[ELEMS * f + e];
#if !defined(EMULATE_COOPMAT)
                if (!layout_ok) {
                    v = uintBitsToFloat(0x7FC00000u);
                }
#endif
                sh_sum[(warp * WG_ROWS + TM * f + g + 8u * (e / 2u)) * TN + 2u * t + e % 2u] = v;
            }
        }
        store_pass_sums(row0, t0);
    }
}
