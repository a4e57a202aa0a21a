// Fragment operations of the cooperative-matrix kernels
// (matmul_coopmat.comp, matmul_coopmat_stream.comp), real or emulated, over
// their shared tiles: the includer declares buf_a, buf_b (uvec4 arrays of
// f16 pairs) and buf_c (f32), and defines A_STRIDE / B_STRIDE, the dword
// strides of the rows of its A and B tiles (multiples of 4). Offsets passed
// to LOAD_A / LOAD_B are in dwords. Also the staging helpers both kernels
// share (put_a / put_b, the rows and inputs of the workgroup's tile, which
// need BM, BN and the global tile_y).
//
// With EMULATE_COOPMAT defined, the fragment operations are plain code over
// the same shared tiles (logical subgroups of 32 invocations, 16x16x16
// fragments), so that the tiling, staging and output paths run and are
// tested on any device; it is slow.

#if defined(EMULATE_COOPMAT)
#define EMU_ELEMS 8u
// A fragment is where it lies in shared memory; the product reads it there
// before the next barrier, as the real fragment would have been read.
#define FRAG_A uint
#define FRAG_B uint
struct Acc {
    float v[EMU_ELEMS];
};
#define WARP_ID (gl_LocalInvocationIndex / 32u)
#define LANE_ID (gl_LocalInvocationIndex % 32u)
#define ACC_ZERO(c) for (uint j_ = 0u; j_ < EMU_ELEMS; j_++) { c.v[j_] = 0.0; }
#define LOAD_A(dst, off) dst = (off)
#define LOAD_B(dst, off) dst = (off)
#define MUL_ADD(c, a, b) emu_mul_add(c, a, b, lane)
#define STORE_C(c, base) for (uint j_ = 0u; j_ < EMU_ELEMS; j_++) { buf_c[(base) + lane + 32u * j_] = c.v[j_]; }
// The logical subgroup spans several real ones on narrow devices.
#define SUBGROUP_SYNC() barrier()

// Lane l owns elements e = l + 32 j of the 16 x 16 fragment, (m, n) = (e % 16, e / 16).
void emu_mul_add(inout Acc c, uint a_off, uint b_off, uint lane) {
    for (uint j = 0u; j < EMU_ELEMS; j++) {
        uint e = lane + 32u * j;
        uint m = e % 16u;
        uint n = e / 16u;
        float s = 0.0;
        for (uint k2 = 0u; k2 < 8u; k2++) {
            uint ia = a_off + m * A_STRIDE + k2;
            uint ib = b_off + n * B_STRIDE + k2;
            vec2 a = unpackHalf2x16(buf_a[ia / 4u][ia % 4u]);
            vec2 b = unpackHalf2x16(buf_b[ib / 4u][ib % 4u]);
            s += a.x * b.x + a.y * b.y;
        }
        c.v[j] += s;
    }
}
#else
#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, TM, TK, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, TK, TN, gl_MatrixUseB>
#define Acc coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>
#define WARP_ID gl_SubgroupID
#define LANE_ID gl_SubgroupInvocationID
#define ACC_ZERO(c) c = Acc(0.0)
// Offsets and strides in 16-byte elements (both multiples of 4 dwords).
#define LOAD_A(dst, off) coopMatLoad(dst, buf_a, (off) / 4u, A_STRIDE / 4u, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_B(dst, off) coopMatLoad(dst, buf_b, (off) / 4u, B_STRIDE / 4u, gl_CooperativeMatrixLayoutColumnMajor)
#define MUL_ADD(c, a, b) c = coopMatMulAdd(a, b, c)
#define STORE_C(c, base) coopMatStore(c, buf_c, base, TM, gl_CooperativeMatrixLayoutColumnMajor)
// A subgroup barrier whose memory semantics cover shared memory only (the
// staged tiles are all it orders); subgroupBarrier() orders every storage
// class, including the weight loads a subgroup keeps in flight across it.
// Measured on the H200: no different (batch_tile Q4_K 4096x14336 at 8
// tokens 620 vs 617 GiB/s), so the loads were not being waited for.
#define SUBGROUP_SYNC() controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared, gl_SemanticsAcquireRelease)
#endif

// Eight values as one 16-byte element of f16 pairs.
uvec4 pack8(vec4 lo, vec4 hi) {
    return uvec4(packHalf2x16(lo.xy), packHalf2x16(lo.zw), packHalf2x16(hi.xy), packHalf2x16(hi.zw));
}

// Stores weight values 8kg .. 8kg+7 of row r of the A tile at a_base.
void put_a(uint a_base, uint r, uint kg, vec4 lo, vec4 hi) {
    buf_a[(a_base + r * A_STRIDE) / 4u + kg] = pack8(lo, hi);
}

// Stores input values 8kg .. 8kg+7 of token n of the B tile at b_base, as
// f16 pairs (put_b_f16) or from f32 (put_b).
void put_b_f16(uint b_base, uint n, uint kg, uvec4 halves) {
    buf_b[(b_base + n * B_STRIDE) / 4u + kg] = halves;
}
void put_b(uint b_base, uint n, uint kg, vec4 lo, vec4 hi) {
    put_b_f16(b_base, n, kg, pack8(lo, hi));
}

// Weight rows past the end read the last row; their results are never written.
uint tile_row_byte(uint r) {
    return min(gl_WorkGroupID.x * BM + r, p.n_rows - 1u) * p.row_stride;
}

#if defined(X_F16)
// Input values 8kg .. 8kg+7 of tile token n of the step at k0 from x in f16
// (the stage before wrote it so: x_h at binding 1, token t's values from
// half t * n_in); zero past the last token or the row's end.
uvec4 input_halves(uint k0, uint n, uint kg) {
    uint tok = tile_y * BN + n;
    if (tok < p.n_tok && k0 + kg * 8u < p.n_in) {
        return x_h[tok * (p.n_in / 8u) + k0 / 8u + kg];
    }
    return uvec4(0u);
}
#endif

// Input values 4k4 .. 4k4+3 of tile token n of the step at k0; zero past
// the last token or the row's end.
vec4 input_vec4(uint k0, uint n, uint k4) {
    uint tok = tile_y * BN + n;
    if (tok < p.n_tok && k0 + k4 * 4u < p.n_in) {
        return x[tok * (p.n_in / 4u) + k0 / 4u + k4];
    }
    return vec4(0.0);
}
