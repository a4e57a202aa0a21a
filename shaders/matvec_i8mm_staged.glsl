// The int8 matvec on the matrix units with staged fragments, for every
// quantised type but Q4_K and Q6_K (included by matvec_i8mm.comp).
//
// Matrix-vector products of decode-sized batches (1..TN tokens per pass) on
// the matrix units: int8 weight codes times int8 activations with int32
// sums (VK_KHR_cooperative_matrix, 16 x TN x 32 s8 fragments).
//
// The packed-dot-product matvec (matvec_i8.comp) spends about ten
// instructions per 16 weights and token on products and float bookkeeping,
// so a batch of 8 costs it ~4x one token (H200, docs/BENCHMARKS.md). Here a
// subgroup stages the codes of 16 rows (as signed bytes, code - offset left
// for later) and the int8 x of the batch into shared memory, one matrix
// product per 32-value block of x gives every row x token its integer dot
// product, and each invocation then scales the elements it holds:
//     acc(r, t) += scale(r) * (d(t) * dot(r, t)) + minv'(r) * s(t)
// which is matvec_i8.comp's formula per block (d: x's scale of the block,
// s: d * the sum of its quants over the fragment's values, minv' = minv -
// scale * offset), so the result is the product with int8 activations that
// the kernel tests hold both kernels to. The weights' decoding is
// matvec_units.glsl's (decode_codes).
//
// A step is 256 values of 16 rows: invocation l loads the 128 values
// 128 (l % 2) .. of row l / 2 (LANE_UNITS units, four x blocks) and its
// share of the batch's x for them, all at once (one 32-value block per
// invocation was too few bytes in flight to cover the memory latency), then
// the subgroup stages and multiplies the step in four rounds of two x
// blocks, one from each half.
//
// A fragment's 32 values need one weight scale: where a unit's two runs of
// a 32-value block share their scale (every type but Q6_K, whose scales
// cover 16 values) one fragment per block holds both runs; for Q6_K each
// block has two fragments, each with one run and zeros in the other half.
//
// Which invocation holds which element of an accumulator is the
// implementation's choice: each subgroup loads the matrix of the element
// indices once and reads its elements back, so the scaling needs no
// assumption about the layout.
//
// The subgroups of a workgroup take the steps of the same 16 rows in turn
// and their sums meet in shared memory at the end, in subgroup order. Every
// token's sums run in the same order whatever the batch, so each token of a
// batch gets the bits of a one-token call.
//
// With EMULATE_COOPMAT the products are plain code over the same shared
// tiles (logical subgroups of 32 invocations, element e of an accumulator
// at row (lane + 32 e) / TN): the staging, the scaling and the reduction
// run, and are tested, on any device.

// Values of a step per row, and per invocation (half a row's step).
const uint STEP = 256u;
const uint LANE_VALUES = 128u;
const uint LANE_UNITS = LANE_VALUES / UNIT_VALUES;
// Rounds of a step: each stages block k of both halves.
const uint ROUNDS = LANE_VALUES / 32u;
#if defined(TYPE_Q6_K)
#define HALF_FRAGMENTS 1
const uint FRAGS = 4u;
#else
const uint FRAGS = 2u;
#endif
// The codes as signed bytes hold code - A_OFFSET (Q8_0's unsigned codes are
// its signed bytes biased by 128: unbiased back, they need no offset).
#if defined(TYPE_Q8_0)
const float A_OFFSET = 0.0;
#else
const float A_OFFSET = CODE_OFFSET;
#endif
// Elements of a TM x TN accumulator per invocation.
const uint ELEMS = TM * TN / LANES;
// Row stride of the staged tiles, in 16-byte words: 32 bytes of values
// padded to 48, so that eight rows' 16-byte loads hit distinct banks.
const uint ROW_WORDS = 3u;
const uint A_FRAG_WORDS = TM * ROW_WORDS;
const uint B_BLOCK_WORDS = TN * ROW_WORDS;
// Per invocation and round: 16-byte x words (2 blocks x TN tokens x 2
// halves per subgroup) and (d, s) pairs (FRAGS x TN per subgroup).
const uint MAX_TN = 16u;
const uint XQ_SLOTS = (2u * MAX_TN * 2u + LANES - 1u) / LANES;
const uint XS_SLOTS = (FRAGS * MAX_TN + LANES - 1u) / LANES;

// Per subgroup, one round's tiles: the A fragments, the two x blocks (token
// t's 32 bytes as column t), per fragment and row (scale, minv') and per
// fragment and token (d, s).
shared uvec4 sh_a[WARPS * FRAGS * A_FRAG_WORDS];
shared uvec4 sh_b[WARPS * 2u * B_BLOCK_WORDS];
shared vec2 sh_wscale[WARPS * FRAGS * TM];
shared vec2 sh_xscale[WARPS * FRAGS * TN];
#if !defined(EMULATE_COOPMAT)
shared int sh_index[TM * TN];
#endif

#if defined(EMULATE_COOPMAT)
#define SYNC() barrier()
#else
#define SYNC() subgroupMemoryBarrierShared(); subgroupBarrier()
#endif

// An int of magnitude < 2^22 as a float, without a conversion instruction
// (a fragment's dot is at most 32 * 128 * 128).
float int_float(int v) {
    return intBitsToFloat(v + 0x4B400000) - 12582912.0;
}

#if defined(EMULATE_COOPMAT)
// The integer product of fragment rows r (A at a_base) and token t (B at
// b_base) over the 32 staged bytes.
int emulated_dot(uint a_base, uint b_base, uint r, uint t) {
    int s = 0;
    for (uint w = 0u; w < 2u; w++) {
        uvec4 a = sh_a[a_base + r * ROW_WORDS + w];
        uvec4 b = sh_b[b_base + t * ROW_WORDS + w];
        for (uint c = 0u; c < 4u; c++) {
            for (uint k = 0u; k < 32u; k += 8u) {
                s += bitfieldExtract(int(a[c]), int(k), 8) * bitfieldExtract(int(b[c]), int(k), 8);
            }
        }
    }
    return s;
}
#endif

// Fragment f of a round: the x block it multiplies (0: the row's first
// half, 1: its second) and, for Q6_K, the half of that block it holds.
uint frag_block(uint f) {
#if defined(HALF_FRAGMENTS)
    return f / 2u;
#else
    return f;
#endif
}

// One step's loads for one invocation: its units, and for each round its
// x words (slot i of the subgroup: block half i / (2 TN), token (i / 2) %
// TN, 16-byte half i % 2) and its (d, s) pairs (slot i: fragment i / TN,
// token i % TN).
struct Fetched {
    Unit un[LANE_UNITS];
    uvec4 xq[ROUNDS][XQ_SLOTS];
    vec2 xs[ROUNDS][XS_SLOTS];
};

Fetched fetch_step(uint step, uint row_byte, uint t0, uint n_x4) {
    uint lane = gl_LocalInvocationIndex % LANES;
    Fetched fr;
    uint u0 = (step * STEP + (lane % 2u) * LANE_VALUES) / UNIT_VALUES;
    [[unroll]] for (uint j = 0u; j < LANE_UNITS; j++) {
        fr.un[j] = load_unit(row_byte, u0 + j);
    }
    [[unroll]] for (uint k = 0u; k < ROUNDS; k++) {
        [[unroll]] for (uint j = 0u; j < XQ_SLOTS; j++) {
            uint i = lane + LANES * j;
            uint t = (i / 2u) % TN;
            // Block k of the step's first half, or of its second.
            uint blk = (step * STEP) / 32u + (i / (2u * TN)) * ROUNDS + k;
            fr.xq[k][j] = uvec4(0u);
            if (i < 2u * TN * 2u && t0 + t < p.n_tok) {
                fr.xq[k][j] = x_int8[(t0 + t) * n_x4 + 2u * blk + i % 2u];
            }
        }
        [[unroll]] for (uint j = 0u; j < XS_SLOTS; j++) {
            uint i = lane + LANES * j;
            fr.xs[k][j] = vec2(0.0);
            if (i < FRAGS * TN) {
                uint f = i / TN;
                uint tok = min(t0 + i % TN, p.n_tok - 1u);
                uint scales = int8_scales_vec4(tok, p.n_in);
                uint sums = int8_sums_vec4(tok, p.n_in);
                uint blk = (step * STEP) / 32u + frag_block(f) * ROUNDS + k;
#if defined(HALF_FRAGMENTS)
                float s = x_int8_f[4u * sums + 2u * blk + f % 2u];
#else
                float s = x_int8_f[4u * sums + 2u * blk] + x_int8_f[4u * sums + 2u * blk + 1u];
#endif
                fr.xs[k][j] = vec2(x_int8_f[4u * scales + blk], s);
            }
        }
    }
    return fr;
}

// Stages round k of a fetched step into the subgroup's tiles: from each
// invocation the runs of its units in block k of its half, as signed codes
// into their fragments (row l / 2), with (scale, minv') per fragment and
// row; the x words and (d, s) pairs of the round.
void stage_round(uint step, uint k, Fetched fr, uint a_base, uint b_base, uint ws_base, uint xs_base) {
    uint lane = gl_LocalInvocationIndex % LANES;
    uint row = lane / 2u;
    uint hv = lane % 2u;
    uint u0 = (step * STEP + hv * LANE_VALUES) / UNIT_VALUES;
    [[unroll]] for (uint j = 0u; j < LANE_UNITS; j++) {
        [[unroll]] for (uint run = 0u; run < RUNS; run++) {
            uint u = u0 + j;
            uint pos = 4u * run_x4(u, run) - step * STEP - hv * LANE_VALUES;
            if (pos / 32u == k) {
                uvec4 codes;
                float scale;
                float minv;
                decode_codes(fr.un[j], run, codes, scale, minv);
#if defined(TYPE_Q8_0)
                codes ^= uvec4(0x80808080u);
#endif
                uint half_ = (pos / 16u) % 2u;
#if defined(HALF_FRAGMENTS)
                uint f = 2u * hv + half_;
#else
                uint f = hv;
#endif
                sh_a[a_base + f * A_FRAG_WORDS + row * ROW_WORDS + half_] = codes;
                // Both halves of a shared-scale block carry the same
                // scale; the first half's run writes it.
#if !defined(HALF_FRAGMENTS)
                if (half_ == 0u)
#endif
                {
                    sh_wscale[ws_base + f * TM + row] = vec2(scale, minv - scale * A_OFFSET);
                }
            }
        }
    }
    [[unroll]] for (uint j = 0u; j < XQ_SLOTS; j++) {
        uint i = lane + LANES * j;
        if (i < 2u * TN * 2u) {
            uint b = i / (2u * TN);
            uint t = (i / 2u) % TN;
            sh_b[b_base + b * B_BLOCK_WORDS + t * ROW_WORDS + i % 2u] = fr.xq[k][j];
        }
    }
    [[unroll]] for (uint j = 0u; j < XS_SLOTS; j++) {
        uint i = lane + LANES * j;
        if (i < FRAGS * TN) {
            sh_xscale[xs_base + i] = fr.xs[k][j];
        }
    }
}

void main() {
    uint tid = gl_LocalInvocationIndex;
    uint warp = tid / LANES;
    uint lane = tid % LANES;
    uint row0 = workgroup_index() * TM;
    uint n_steps = p.n_in / STEP;
    // Every subgroup runs the same number of turns (the emulation's
    // barriers are the workgroup's); turns past the last step stage nothing.
    uint turns = (n_steps + WARPS - 1u) / WARPS;
    uint a_base = warp * FRAGS * A_FRAG_WORDS;
    uint b_base = warp * 2u * B_BLOCK_WORDS;
    uint ws_base = warp * FRAGS * TM;
    uint xs_base = warp * FRAGS * TN;

    // Rows past the end read the last row; their sums are never written.
    uint row_byte = min(row0 + lane / 2u, p.n_rows - 1u) * p.row_stride;

    // Which row and token each of this invocation's elements is.
    uint elem_row[ELEMS];
    uint elem_tok[ELEMS];
#if defined(EMULATE_COOPMAT)
    [[unroll]] for (uint e = 0u; e < ELEMS; e++) {
        elem_row[e] = (lane + LANES * e) / TN;
        elem_tok[e] = (lane + LANES * e) % TN;
    }
#else
    for (uint i = tid; i < TM * TN; i += THREADS) {
        sh_index[i] = int(i);
    }
    barrier();
    coopmat<int32_t, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator> index_matrix;
    coopMatLoad(index_matrix, sh_index, 0, TN, gl_CooperativeMatrixLayoutRowMajor);
    // An implementation holding another count per invocation than
    // TM * TN / 32 would leave elements unscaled: make that loud.
    bool layout_ok = index_matrix.length() == int(ELEMS);
    [[unroll]] for (uint e = 0u; e < ELEMS; e++) {
        uint i = uint(index_matrix[e]);
        elem_row[e] = i / TN;
        elem_tok[e] = i % TN;
    }
    coopmat<int32_t, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator> zero_acc =
        coopmat<int32_t, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>(0);
#endif

#if defined(HALF_FRAGMENTS)
    // Each fragment stages one half of its rows; the other half stays zero.
    for (uint i = lane; i < FRAGS * A_FRAG_WORDS; i += LANES) {
        sh_a[a_base + i] = uvec4(0u);
    }
    SYNC();
#endif

    uint n_x4 = int8_token_vec4s(p.n_in);
    for (uint t0 = 0u; t0 < p.n_tok; t0 += TN) {
        float acc[ELEMS];
        [[unroll]] for (uint e = 0u; e < ELEMS; e++) {
            acc[e] = 0.0;
        }
        for (uint turn = 0u; turn < turns; turn++) {
            uint step = turn * WARPS + warp;
            bool live = step < n_steps;
            Fetched fr;
            if (live) {
                fr = fetch_step(step, row_byte, t0, n_x4);
            }
            [[unroll]] for (uint k = 0u; k < ROUNDS; k++) {
                if (live) {
                    stage_round(step, k, fr, a_base, b_base, ws_base, xs_base);
                }
                SYNC();
                if (live) {
                    [[unroll]] for (uint f = 0u; f < FRAGS; f++) {
                        uint fa = a_base + f * A_FRAG_WORDS;
                        uint fb = b_base + frag_block(f) * B_BLOCK_WORDS;
#if !defined(EMULATE_COOPMAT)
                        coopmat<int8_t, gl_ScopeSubgroup, TM, 32, gl_MatrixUseA> a;
                        coopmat<int8_t, gl_ScopeSubgroup, 32, TN, gl_MatrixUseB> b;
                        coopMatLoad(a, sh_a, fa, ROW_WORDS, gl_CooperativeMatrixLayoutRowMajor);
                        coopMatLoad(b, sh_b, fb, ROW_WORDS, gl_CooperativeMatrixLayoutColumnMajor);
                        coopmat<int32_t, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator> c =
                            coopMatMulAdd(a, b, zero_acc);
#endif
                        [[unroll]] for (uint e = 0u; e < ELEMS; e++) {
#if defined(EMULATE_COOPMAT)
                            int dot = emulated_dot(fa, fb, elem_row[e], elem_tok[e]);
#else
                            int dot = c[e];
#endif
                            vec2 ws = sh_wscale[ws_base + f * TM + elem_row[e]];
                            vec2 xs = sh_xscale[xs_base + f * TN + elem_tok[e]];
                            acc[e] += ws.x * (xs.x * int_float(dot)) + ws.y * xs.y;
                        }
                    }
                }
                SYNC();
            }
        }
        // The subgroups' sums, added in subgroup order.
        [[unroll]] for (uint e = 0u; e < ELEMS; e++) {
#if !defined(EMULATE_COOPMAT)
            if (!layout_ok) {
                acc[e] = uintBitsToFloat(0x7FC00000u);
            }
#endif
            sh_sum[(warp * TM + elem_row[e]) * TN + elem_tok[e]] = acc[e];
        }
        store_pass_sums(row0, t0);
    }
}
