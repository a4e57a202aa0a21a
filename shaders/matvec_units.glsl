// Weight decoding for the matvec kernel, per type, on the device layout of
// dequant.glsl (included first, with the uvec4 view `w4` of the weights).
//
// A row is cut into units of UNIT_VALUES values that one thread loads with
// 16-byte loads where the layout allows (load_unit, in matvec_loads.glsl),
// and a unit into RUNS runs of 16 consecutive values that share one scale
// (and min). decode_run
// returns a run's 16 quants as exact small-integer floats q, its scale and
// its min: the run adds scale * dot(q, x) + minv * sum(x) to the dot
// product. For the quantised types decode_run is built on decode_codes,
// which returns the run's 16 codes as unsigned bytes (four per uint) with
// q = code - CODE_OFFSET: the int8-activation kernel (matvec_i8.comp) feeds
// them to packed dot products without converting them to floats. run_x4 is
// the run's first value / 4 within the row (x is read as vec4). (Splitting a unit over lanes so that a subgroup reads x as one
// contiguous stretch measured slower on the H200: each lane then keeps
// fewer weight bytes in flight.)
//
// Quants become floats without int-to-float conversions (byte_fields and
// small_uint_float, dequant.glsl), and Q4_K's nibbles two at a time: a field
// OR-ed into the mantissa of f16 1024.0 reads as 1024 + field (pair_fields),
// one logic instruction per two values where byte_fields takes one per value.
// The matvec is bound by its instructions on the H200 (every quantised type
// ran at about the same time per value), so what counts is instructions per
// value: for Q4_K the pairs measured +4% over byte_fields and the scale
// decode shared by a unit's two runs +7% (docs/BENCHMARKS.md); for whole
// bytes (Q5_0, Q6_K, Q8_0) the pairs lost 3-8%, since their conversion and
// subtraction outnumber the logic saved, and for Q4_0 they were mixed. The
// 1024 is subtracted per value, exactly, so the floats are those byte_fields
// gives. (Leaving it in and folding it into the run's min would save that
// subtraction but loses ~10 bits of the run's sum to cancellation: measured
// past the kernel tests' bound.)

// f16 1024.0 in both halves of a word.
const uint F16_1024X2 = 0x64006400u;

// The fields that `mask` selects in each byte of v (mask names them for
// bytes 0 and 2; bytes 1 and 3 are read through v >> 8), byte i in
// component i, each as 1024 + the field's bits read as an integer (fields
// of bits 4..7 thus read 16 times their value). Fields must stay below
// 1024, so that the sum is exact.
vec4 pair_fields(uint v, uint mask) {
    vec2 e = unpackHalf2x16((v & mask) | F16_1024X2);
    vec2 o = unpackHalf2x16(((v >> 8) & mask) | F16_1024X2);
    return vec4(e.x, o.x, e.y, o.y);
}

#if defined(TYPE_F32)
#define UNIT_VALUES 32u
#define RUNS 2u
struct Unit { uvec4 v[8]; };
void decode_run(Unit un, uint run, out vec4 q[4], out float scale, out float minv) {
    for (uint k = 0u; k < 4u; k++) {
        q[k] = uintBitsToFloat(un.v[4u * run + k]);
    }
    scale = 1.0;
    minv = 0.0;
}
uint run_x4(uint u, uint run) { return 8u * u + 4u * run; }

#elif defined(TYPE_F16)
#define UNIT_VALUES 32u
#define RUNS 2u
struct Unit { uvec4 v[4]; };
void decode_run(Unit un, uint run, out vec4 q[4], out float scale, out float minv) {
    uvec4 a = un.v[2u * run];
    uvec4 b = un.v[2u * run + 1u];
    q[0] = vec4(unpackHalf2x16(a.x), unpackHalf2x16(a.y));
    q[1] = vec4(unpackHalf2x16(a.z), unpackHalf2x16(a.w));
    q[2] = vec4(unpackHalf2x16(b.x), unpackHalf2x16(b.y));
    q[3] = vec4(unpackHalf2x16(b.z), unpackHalf2x16(b.w));
    scale = 1.0;
    minv = 0.0;
}
uint run_x4(uint u, uint run) { return 8u * u + 4u * run; }

#elif defined(TYPE_Q4_0) || defined(TYPE_Q4_1)
// One block per unit: run 0 is the low nibbles (values 0..15), run 1 the high ones.
#define UNIT_VALUES 32u
#define RUNS 2u
struct Unit { uvec4 qs; vec2 dm; };
#if defined(TYPE_Q4_0)
#define CODE_OFFSET 8.0
#else
#define CODE_OFFSET 0.0
#endif
void decode_codes(Unit un, uint run, out uvec4 v, out float scale, out float minv) {
    v = run == 0u ? un.qs & 0x0f0f0f0fu : (un.qs >> 4) & 0x0f0f0f0fu;
    scale = un.dm.x;
    minv = un.dm.y;
}
uint run_x4(uint u, uint run) { return 8u * u + 4u * run; }

#elif defined(TYPE_Q5_0) || defined(TYPE_Q5_1)
#define UNIT_VALUES 32u
#define RUNS 2u
struct Unit { uvec4 qs; uint qh; vec2 dm; };
#if defined(TYPE_Q5_0)
#define CODE_OFFSET 16.0
#else
#define CODE_OFFSET 0.0
#endif
void decode_codes(Unit un, uint run, out uvec4 v, out float scale, out float minv) {
    for (uint k = 0u; k < 4u; k++) {
        v[k] = run == 0u ? (un.qs[k] & 0x0f0f0f0fu) | qh5_lo(un.qh, k)
                         : ((un.qs[k] >> 4) & 0x0f0f0f0fu) | qh5_hi(un.qh, k);
    }
    scale = un.dm.x;
    minv = un.dm.y;
}
uint run_x4(uint u, uint run) { return 8u * u + 4u * run; }

#elif defined(TYPE_Q8_0)
// One block per unit: run 0 is bytes 0..15, run 1 bytes 16..31. The signed
// bytes are biased by 128 (xor 0x80) to decode them as unsigned fields.
#define UNIT_VALUES 32u
#define RUNS 2u
struct Unit { uvec4 q[2]; float d; };
#define CODE_OFFSET 128.0
void decode_codes(Unit un, uint run, out uvec4 v, out float scale, out float minv) {
    v = un.q[run] ^ uvec4(0x80808080u);
    scale = un.d;
    minv = 0.0;
}
uint run_x4(uint u, uint run) { return 8u * u + 4u * run; }

#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
// Eight units per super-block: unit v covers qs[16v .. 16v+15], i.e. chunk
// c = v / 2, bytes l = 16 (v % 2) + i; run 0 (low nibbles) is sub-block 2c,
// values 64c + l; run 1 (high nibbles) sub-block 2c + 1, values 64c + 32 + l.
#define UNIT_VALUES 32u
#define RUNS 2u
struct Unit {
    uvec4 head; // d, dmin (f16) and the 12 scale bytes
    uvec4 qs;
#if defined(TYPE_Q5_K)
    uvec4 qh;
#endif
    uint c;
};
#define CODE_OFFSET 0.0
// The 6-bit scales and mins of sub-blocks 2c and 2c + 1 as floats (sc0,
// sc1, m0, m1): scale_min_k4_words (dequant.glsl) for two neighbouring
// sub-blocks at once. Sub-blocks j < 4: 6 bits of byte j (scale) and j + 4
// (min); j >= 4: 4 bits of byte j + 4 and the top 2 bits of bytes j - 4 /
// j. The two sub-blocks' bytes sit side by side in each head word, so one
// set of shifts and masks serves both: the unrolled run loop asks for the
// same expression twice and the driver computes it once.
vec4 q4k_scales_mins(uvec4 head, uint c) {
    uint s16 = 16u * (c & 1u);
    uint y = head.y >> s16;
    uint z = head.z >> s16;
    uint e = head.w >> s16;
    uint sc = c < 2u ? y & 0x3F3Fu : (e & 0x0F0Fu) | ((y >> 2) & 0x3030u);
    uint m = c < 2u ? z & 0x3F3Fu : ((e >> 4) & 0x0F0Fu) | ((z >> 2) & 0x3030u);
    return pair_fields(sc | (m << 16), 0x00FF00FFu) - 1024.0;
}
// The scale and min of run `run` of the unit (sub-block 2c + run).
void run_scale(Unit un, uint run, out float scale, out float minv) {
    vec4 sm = q4k_scales_mins(un.head, un.c);
    vec2 dd = unpackHalf2x16(un.head.x);
    scale = dd.x * (run == 0u ? sm.x : sm.y);
    minv = -dd.y * (run == 0u ? sm.z : sm.w);
}
void decode_codes(Unit un, uint run, out uvec4 v, out float scale, out float minv) {
    run_scale(un, run, scale, minv);
    v = run == 0u ? un.qs & 0x0f0f0f0fu : (un.qs >> 4) & 0x0f0f0f0fu;
#if defined(TYPE_Q5_K)
    v |= ((un.qh >> (2u * un.c + run)) & 0x01010101u) << 4;
#endif
}
uint run_x4(uint u, uint run) {
    uint sb = u / 8u;
    uint v = u % 8u;
    return (256u * sb + 64u * (v / 2u) + 32u * run + 16u * (v & 1u)) / 4u;
}

#elif defined(TYPE_Q6_K)
// Four units per super-block: unit v4 is half n = v4 / 2 and l = 16 (v4 % 2)
// + i; it loads ql[64n + l] and ql[64n + 32 + l] (quarters 0/2 and 1/3 of
// the half) and qh[32n + l]. Run r is quarter qq = r: values 128n + 32qq + l,
// scale 8n + l / 16 + 2qq.
#define UNIT_VALUES 64u
#define RUNS 4u
struct Unit { uvec4 ql[2]; uvec4 qh; uvec4 scales; float d; uint n; uint half_l; };
#define CODE_OFFSET 32.0
void decode_codes(Unit un, uint run, out uvec4 v, out float scale, out float minv) {
    uint qq = run;
    uvec4 l4 = un.ql[qq & 1u];
    v = qq < 2u ? l4 & 0x0f0f0f0fu : (l4 >> 4) & 0x0f0f0f0fu;
    v |= ((un.qh >> (2u * qq)) & 0x03030303u) << 4;
    uint s = 8u * un.n + un.half_l + 2u * qq;
    scale = un.d * sbyte_float((un.scales[s / 4u] >> (8u * (s % 4u))) & 0xFFu);
    minv = 0.0;
}
uint run_x4(uint u, uint run) {
    uint sb = u / 4u;
    return (256u * sb + 128u * ((u / 2u) % 2u) + 32u * run + 16u * (u % 2u)) / 4u;
}

#elif defined(TYPE_FQ3)
// Two units per block: unit u is groups 4u .. 4u+3 of the row (values 128u
// .. 128u+127), sub-blocks j0 .. j0+3 of block u / 2 with j0 = 4 (u % 2). It
// loads the A, B and C words of its four groups with one 16-byte load each
// from the row's word planes (dequant.glsl) and its block's head. Run r is
// group r / 2, values 16 (r % 2) .. +15 of it: s = 4 (r % 2) + k for q[k].
#define UNIT_VALUES 128u
#define RUNS 8u
struct Unit { uvec4 head; uvec4 a; uvec4 b; uvec4 c; uint j0; };
#define CODE_OFFSET 0.0
void decode_codes(Unit un, uint run, out uvec4 v, out float scale, out float minv) {
    uint gi = run / 2u;
    uint half_run = run & 1u;
    // The Q4_K packing for sub-block j = j0 + gi (j & 3 = gi): 6 bits of
    // scale byte gi and gi + 4 for j < 4, else 4 bits of byte gi + 8 and the
    // top 2 bits of bytes gi / gi + 4.
    uint sh = 8u * gi;
    uint b_sc = (un.head.y >> sh) & 0xFFu;
    uint b_m = (un.head.z >> sh) & 0xFFu;
    uint b_e = (un.head.w >> sh) & 0xFFu;
    uint sc = un.j0 == 0u ? b_sc & 63u : (b_e & 15u) | ((b_sc >> 6) << 4);
    uint m = un.j0 == 0u ? b_m & 63u : (b_e >> 4) | ((b_m >> 6) << 4);
    vec2 dd = unpackHalf2x16(un.head.x);
    scale = dd.x * small_uint_float(sc);
    minv = -dd.y * small_uint_float(m);
    uint low = half_run == 0u ? un.a[gi] : un.b[gi];
    uint c = un.c[gi];
    for (uint k = 0u; k < 4u; k++) {
        v[k] = fq3_codes(low, c, 4u * half_run + k);
    }
}
uint run_x4(uint u, uint run) { return 32u * u + 4u * run; }

#else
#error "define one TYPE_X"
#endif

// load_unit: the units of the weights at binding 0.
#define LOAD_UNIT load_unit
#define LOAD_WORDS4 w4
#define LOAD_WORDS w
#define TOUCH_UNIT touch_unit
#include "matvec_loads.glsl"
#undef LOAD_UNIT
#undef LOAD_WORDS4
#undef LOAD_WORDS
#undef TOUCH_UNIT

#if defined(TYPE_Q4_1) || defined(TYPE_Q5_1) || defined(TYPE_Q4_K) || defined(TYPE_Q5_K) || defined(TYPE_FQ3)
#define HAS_MIN 1
#endif

#if defined(TYPE_Q4_K)
// Q4_K takes its nibbles straight from qs. Run 0 is the low nibbles of the unit's qs, run 1 the high ones (run_scale
// gives each run's scale and min): masked in place, the low ones read as
// 1024 + code and the high ones as 1024 + 16 code, and one exact fma per
// value leaves code - CODE_OFFSET. Five logic instructions per qs word
// (eight values, both runs: the shift by 8 serves both).
void decode_run(Unit un, uint run, out vec4 q[4], out float scale, out float minv) {
    uint mask = run == 0u ? 0x000F000Fu : 0x00F000F0u;
    float unit_value = run == 0u ? 1.0 : 1.0 / 16.0;
    float bias = -(1024.0 * unit_value + CODE_OFFSET);
    for (uint k = 0u; k < 4u; k++) {
        q[k] = pair_fields(un.qs[k], mask) * unit_value + bias;
    }
    run_scale(un, run, scale, minv);
}
#elif defined(CODE_OFFSET)
// A quantised type: its floats are its codes minus the offset.
void decode_run(Unit un, uint run, out vec4 q[4], out float scale, out float minv) {
    uvec4 v;
    decode_codes(un, run, v, scale, minv);
    for (uint k = 0u; k < 4u; k++) {
        q[k] = byte_fields(v[k], CODE_OFFSET);
    }
}
#endif
