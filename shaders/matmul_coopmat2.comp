#version 450
// The prefill matmul on workgroup-scope cooperative matrices with tensor
// addressing (GL_NV_cooperative_matrix2): the same product as
// matmul_coopmat.comp (y[t * y_stride + y_offset + r] = sum_i W[r][i] *
// x[t * n_in + i], optionally added to y), but the driver stages A and B
// through shared memory itself. Weights are decoded by a per-element
// function the loads call (decode_w), x is read as f32 and rounded to f16
// by decode_x, so the products round exactly as in the staged kernel: f16
// weights (each decoded in f32, then rounded) times f16 x, summed in f32.
//
// Tensor layouts: W is n_rows x n_in in blocks of one row x BLOCK_VALUES
// values; x and y are token-major, so their matrices (k x tokens and rows
// x tokens) load and store through a transposing view. A workgroup owns a
// BM x BN output tile, walks k in steps of BK, and with `split` > 1 only
// its share of the steps, leaving the partial tile to finish_split
// (coopmat_output.glsl) as the staged kernel does.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
#extension GL_EXT_buffer_reference : require

layout(constant_id = 0) const uint THREADS = 256u;
layout(constant_id = 1) const uint BM = 128u;
layout(constant_id = 2) const uint BN = 128u;
layout(constant_id = 3) const uint BK = 32u;
layout(local_size_x_id = 0) in;

#include "common.glsl"

layout(std430, binding = 1) readonly buffer XF { float x_f[]; };
layout(std430, binding = 2) buffer YF { float y_f[]; };

const uint CLAMP = gl_CooperativeMatrixClampModeConstantNV;

#if defined(TYPE_Q4_K)
// One GGUF block of 256 values: f16 d and dmin, 12 bytes of 6-bit scales
// and mins, 128 bytes of nibbles (dequant.glsl; Q4_K rows keep these bytes).
#define BLOCK_VALUES 256u
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer WBlock {
    uvec4 head;
    uint qs[32];
};

// The 16-byte head (d and dmin, then the 12 scale bytes) is one load; the
// element's nibble another.
float16_t decode_w(const in WBlock b, const in uint block[2], const in uint in_block[2]) {
    uint k = in_block[1];
    uint j = k >> 5;
    uint l = k & 31u;
    uint byte_i = 32u * (j >> 1) + l;
    uint q = (b.qs[byte_i >> 2] >> (8u * (byte_i & 3u) + 4u * (j & 1u))) & 0xFu;
    uvec4 head = b.head;
    // Scale bytes 0..11 are bytes 4..15 of the head (words y, z, w); byte
    // i of word y is scale byte i, of z byte i + 4, of w byte i + 8.
    uint sh = 8u * (j & 3u);
    uint sc;
    uint m;
    if (j < 4u) {
        sc = (head.y >> sh) & 63u;
        m = (head.z >> sh) & 63u;
    } else {
        uint e = (head.w >> sh) & 0xFFu;
        sc = (e & 15u) | (((head.y >> sh) >> 6) & 3u) << 4;
        m = (e >> 4) | (((head.z >> sh) >> 6) & 3u) << 4;
    }
    vec2 dd = unpackHalf2x16(head.x);
    return float16_t(dd.x * float(sc) * float(q) - dd.y * float(m));
}

#elif defined(TYPE_Q6_K)
// Q6_K rows are not whole GGUF blocks on the device (dequant.glsl: 208-byte
// block bodies, then the row's f16 scales), so the decode reads the weight
// words at binding 0 from the block's coordinates and ignores its pointer.
#define BLOCK_VALUES 256u
#define Q6_BODY_BYTES 208u
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer WBlock {
    uint unused;
};

uint w_byte(uint at) {
    return (w[at >> 2] >> (8u * (at & 3u))) & 0xFFu;
}

float16_t decode_w(const in WBlock b, const in uint block[2], const in uint in_block[2]) {
    uint row_byte = block[0] * p.row_stride;
    uint blk = block[1];
    uint body = row_byte + blk * Q6_BODY_BYTES;
    uint k = in_block[1];
    uint n = k >> 7;
    uint qq = (k >> 5) & 3u;
    uint l = k & 31u;
    uint low = (w_byte(body + 64u * n + 32u * (qq & 1u) + l) >> (4u * (qq >> 1))) & 0xFu;
    uint high = (w_byte(body + 128u + 32u * n + l) >> (2u * qq)) & 3u;
    int sc = int(w_byte(body + 192u + 8u * n + (l >> 4) + 2u * qq) << 24) >> 24;
    uint nb = p.n_in / BLOCK_VALUES;
    uint d_at = row_byte + Q6_BODY_BYTES * nb + 2u * blk;
    float d = unpackHalf2x16((w[d_at >> 2] >> (8u * (d_at & 2u))) & 0xFFFFu).x;
    return float16_t(d * float(sc) * (float(low | (high << 4)) - 32.0));
}

#else
#error "matmul_coopmat2.comp: define TYPE_Q4_K or TYPE_Q6_K"
#endif

layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer XValue {
    float v;
};

float16_t decode_x(const in XValue b, const in uint block[2], const in uint in_block[2]) {
    return float16_t(b.v);
}

// For coopmat_output.glsl (its split path only): the tile's token block
// and this workgroup's share of the split steps.
uint tile_y;
uint split_z;
#define TENSOR_STORES 1
#include "coopmat_output.glsl"

void main() {
    tile_y = gl_WorkGroupID.y / p.split;
    split_z = gl_WorkGroupID.y % p.split;
    uint row0 = gl_WorkGroupID.x * BM;
    uint tok0 = tile_y * BN;

    tensorLayoutNV<2, CLAMP> w_layout = createTensorLayoutNV(2, CLAMP);
    w_layout = setTensorLayoutBlockSizeNV(w_layout, 1, BLOCK_VALUES);
    w_layout = setTensorLayoutDimensionNV(w_layout, p.n_rows, p.n_in);

    tensorLayoutNV<2, CLAMP> x_layout = createTensorLayoutNV(2, CLAMP);
    x_layout = setTensorLayoutDimensionNV(x_layout, p.n_tok, p.n_in);
    tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);

    uint steps = (p.n_in + BK - 1u) / BK;
    uint per_split = (steps + p.split - 1u) / p.split;
    uint step0 = split_z * per_split;
    uint step1 = min(steps, step0 + per_split);

    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    for (uint s = step0; s < step1; s++) {
        uint k0 = s * BK;
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> a;
        coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> b;
        coopMatLoadTensorNV(a, w, 0, sliceTensorLayoutNV(w_layout, row0, BM, k0, BK), decode_w);
        coopMatLoadTensorNV(b, x_f, 0, sliceTensorLayoutNV(x_layout, tok0, BN, k0, BK),
                            transposed, decode_x);
        acc = coopMatMulAdd(a, b, acc);
    }

    if (p.split > 1u) {
        // The partial tile, column-major (element e = row + BM * token), as
        // partial_index lays it out.
        tensorLayoutNV<2> part = createTensorLayoutNV(2);
        part = setTensorLayoutDimensionNV(part, BN, BM);
        coopMatStoreTensorNV(acc, split_part, partial_index(split_z, 0u),
                             sliceTensorLayoutNV(part, 0, BN, 0, BM), transposed);
        finish_split();
        return;
    }

    // y is token-major: tokens are the layout's rows. Loads and stores
    // start at a 16-byte aligned element, y_offset rounded down; the plan
    // takes this kernel only where y_stride (and so every tensor's and
    // chunk's y_offset but for the chunk's first row) is a multiple of 4,
    // so the columns before the rows' own still fit in a stride.
    uint y_base = p.y_offset & ~3u;
    uint c0 = p.y_offset & 3u;
    tensorLayoutNV<2, CLAMP> y_layout = createTensorLayoutNV(2, CLAMP);
    y_layout = setTensorLayoutDimensionNV(y_layout, p.n_tok, c0 + p.n_rows);
    y_layout = setTensorLayoutStrideNV(y_layout, p.y_stride, 1);
    y_layout = sliceTensorLayoutNV(y_layout, tok0, BN, c0 + row0, BM);
    if (p.accumulate != 0u) {
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> old;
        coopMatLoadTensorNV(old, y_f, y_base, y_layout, transposed);
        acc = acc + old;
    }
    coopMatStoreTensorNV(acc, y_f, y_base, y_layout, transposed);
}
