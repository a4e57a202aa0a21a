// f16 matrix fragments built in registers, in the layout the H200's driver
// gives 16 x 8 x 16 f16 products (matvec_i8mm_h16.glsl states it): the
// element types, the fragment builders, the product (or its emulation on
// plain code) and, where FRAG16_LAYOUT_PROBE is defined, the in-kernel
// layout check (layout_matches); frag16_pairs.glsl has the
// weight pairs of Q4_K and Q6_K codes. Included by matvec_i8mm_h16.glsl
// and matmul_frags.comp after they define WARPS, TM (16), LANES, THREADS
// and ELEMS (4). The emulation's products are barriers of the whole
// workgroup, so every subgroup must call them equally often.

// f16 pairs: the element type of the fragments, two at a time. Emulated,
// f32 pairs rounded to f16 where the real kernel's arithmetic rounds.
#if defined(EMULATE_COOPMAT)
#define H2 vec2
#define H1 float
H2 h2_bits(uint u) { return unpackHalf2x16(u); }
H2 h2_round(vec2 v) { return unpackHalf2x16(packHalf2x16(v)); }
H1 h1(float v) { return h2_round(vec2(v)).x; }
#else
#define H2 f16vec2
#define H1 float16_t
H2 h2_bits(uint u) { return unpackFloat2x16(u); }
H2 h2_round(H2 v) { return v; }
H1 h1(float v) { return float16_t(v); }
#endif

// Bit pattern of the f16 pair (1024 + a, 1024 + b) for fields a, b < 1024
// in bits 0.. and 16.. (the exponent of 1024 has unit steps).
const uint F16_1024 = 0x64006400u;

// Values (0, 2) and (1, 3) of four signed int8 x in a word, times d: the
// bytes biased to unsigned fields (xor 0x80), read as 1152 + q, the bias
// removed exactly, then scaled (one rounding).
void x_pairs(uint word, H1 d, out H2 p02, out H2 p13) {
    const uint BIASED = 0x64806480u;
    H2 lo = h2_bits((word & 0x00FF00FFu) ^ BIASED) - H2(1152.0);
    H2 hi = h2_bits(((word >> 8) & 0x00FF00FFu) ^ BIASED) - H2(1152.0);
    p02 = h2_round(lo * d);
    p13 = h2_round(hi * d);
}

#if defined(EMULATE_COOPMAT)
// Per subgroup the fragments of one product: A [row][column], B [token]
// [row] (floats).
shared float sh_ea[WARPS * TM * 16u];
shared float sh_eb[WARPS * 8u * 16u];
#define A_FRAG vec2[4]
#define B_FRAG vec2[2]
#define C_FRAG float[ELEMS]

A_FRAG make_a(H2 g02, H2 g13, H2 h02, H2 h13) {
    return A_FRAG(g02, g13, h02, h13);
}
B_FRAG make_b(H2 p02, H2 p13) {
    return B_FRAG(p02, p13);
}
C_FRAG c_zero() { return C_FRAG(0.0, 0.0, 0.0, 0.0); }

// acc + a b in plain code: each invocation stores its elements into the
// subgroup's tiles (barriers of the whole workgroup: every subgroup calls
// it equally often), then sums its four elements from them.
C_FRAG emulated_product(A_FRAG a, B_FRAG b, C_FRAG acc) {
    uint lane = gl_LocalInvocationIndex % LANES;
    uint warp = gl_LocalInvocationIndex / LANES;
    uint g = lane / 4u;
    uint t = lane % 4u;
    uint ab = warp * TM * 16u;
    uint bb = warp * 8u * 16u;
    [[unroll]] for (uint e = 0u; e < 8u; e++) {
        uint r = g + 8u * (e / 4u);
        uint col = 2u * t + e % 2u + 8u * ((e / 2u) % 2u);
        sh_ea[ab + r * 16u + col] = a[e / 2u][e % 2u];
    }
    [[unroll]] for (uint e = 0u; e < 4u; e++) {
        uint k = 2u * t + e % 2u + 8u * (e / 2u);
        sh_eb[bb + g * 16u + k] = b[e / 2u][e % 2u];
    }
    barrier();
    C_FRAG c = acc;
    [[unroll]] for (uint e = 0u; e < ELEMS; e++) {
        uint r = g + 8u * (e / 2u);
        uint tok = 2u * t + e % 2u;
        float s = 0.0;
        for (uint k = 0u; k < 16u; k++) {
            s = fma(sh_ea[ab + r * 16u + k], sh_eb[bb + tok * 16u + k], s);
        }
        c[e] += s;
    }
    barrier();
    return c;
}
#define PRODUCT(a, b, acc) emulated_product(a, b, acc)
#else
#define A_FRAG coopmat<float16_t, gl_ScopeSubgroup, TM, 16, gl_MatrixUseA>
#define B_FRAG coopmat<float16_t, gl_ScopeSubgroup, 16, 8, gl_MatrixUseB>
#define C_FRAG coopmat<float, gl_ScopeSubgroup, TM, 8, gl_MatrixUseAccumulator>
#define PRODUCT(a, b, acc) coopMatMulAdd(a, b, acc)

// A from rows g (pairs g02, g13: columns (2t, 2t + 1), (2t + 8, 2t + 9))
// and g + 8 (h02, h13).
A_FRAG make_a(H2 g02, H2 g13, H2 h02, H2 h13) {
    A_FRAG a;
    a[0] = g02.x;
    a[1] = g02.y;
    a[2] = g13.x;
    a[3] = g13.y;
    a[4] = h02.x;
    a[5] = h02.y;
    a[6] = h13.x;
    a[7] = h13.y;
    return a;
}
// B from the pairs of rows (2t, 2t + 1) and (2t + 8, 2t + 9).
B_FRAG make_b(H2 p02, H2 p13) {
    B_FRAG b;
    b[0] = p02.x;
    b[1] = p02.y;
    b[2] = p13.x;
    b[3] = p13.y;
    return b;
}
C_FRAG c_zero() { return C_FRAG(0.0); }

#if defined(FRAG16_LAYOUT_PROBE)
// The element-index matrices of the layout check, as f16 pairs: A (16 x 16
// row-major), B (16 x 8 row-major: row k, column n), and C's element
// numbers (row-major floats).
shared uint sh_probe_a[TM * 16u / 2u];
shared uint sh_probe_b[16u * 8u / 2u];
shared float sh_probe_c[TM * 8u];

// Whether the implementation's layout is the one this kernel is written
// for (see the top of this file). Every invocation must call it (barrier).
bool layout_matches() {
    uint tid = gl_LocalInvocationIndex;
    for (uint i = tid; i < TM * 16u / 2u; i += THREADS) {
        sh_probe_a[i] = packHalf2x16(vec2(2u * i, 2u * i + 1u));
    }
    for (uint i = tid; i < 16u * 8u / 2u; i += THREADS) {
        sh_probe_b[i] = packHalf2x16(vec2(2u * i, 2u * i + 1u));
    }
    for (uint i = tid; i < TM * 8u; i += THREADS) {
        sh_probe_c[i] = float(i);
    }
    barrier();
    A_FRAG a;
    B_FRAG b;
    C_FRAG c;
    coopMatLoad(a, sh_probe_a, 0, 8, gl_CooperativeMatrixLayoutRowMajor);
    coopMatLoad(b, sh_probe_b, 0, 4, gl_CooperativeMatrixLayoutRowMajor);
    coopMatLoad(c, sh_probe_c, 0, 8, gl_CooperativeMatrixLayoutRowMajor);
    uint lane = tid % LANES;
    uint g = lane / 4u;
    uint t = lane % 4u;
    bool ok = a.length() == 8 && b.length() == 4 && c.length() == int(ELEMS);
    for (uint e = 0u; e < 8u && ok; e++) {
        uint r = g + 8u * (e / 4u);
        uint col = 2u * t + e % 2u + 8u * ((e / 2u) % 2u);
        ok = ok && uint(a[e]) == r * 16u + col;
    }
    for (uint e = 0u; e < 4u && ok; e++) {
        uint k = 2u * t + e % 2u + 8u * (e / 2u);
        ok = ok && uint(b[e]) == k * 8u + g;
    }
    for (uint e = 0u; e < ELEMS && ok; e++) {
        ok = ok && uint(c[e]) == (g + 8u * (e / 2u)) * 8u + 2u * t + e % 2u;
    }
    return ok;
}
#endif
#endif
