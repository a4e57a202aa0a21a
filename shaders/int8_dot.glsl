// The packed int8 products of the int8-activation matvecs (matvec_i8.comp,
// span_persistent_layer.comp). The includer enables GL_EXT_spirv_intrinsics.
#if !defined(INT8_DOT_GLSL)
#define INT8_DOT_GLSL 1

// OpSUDot with the 4x8-bit packed format: the signed bytes of a times the
// unsigned bytes of b, summed.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int dot_i8_u8(uint a, uint b, spirv_literal int packed_format);
const int PACKED_4X8 = 0;

// An int of magnitude < 2^22 as a float, without a conversion instruction
// (a run's dot is at most 16 * 255 * 127).
float int_float(int v) {
    return intBitsToFloat(v + 0x4B400000) - 12582912.0;
}

// Sixteen int8 activations (q) times sixteen unsigned codes, summed.
int dot16(uvec4 q, uvec4 codes) {
    return dot_i8_u8(q.x, codes.x, PACKED_4X8)
         + dot_i8_u8(q.y, codes.y, PACKED_4X8)
         + dot_i8_u8(q.z, codes.z, PACKED_4X8)
         + dot_i8_u8(q.w, codes.w, PACKED_4X8);
}
#endif
