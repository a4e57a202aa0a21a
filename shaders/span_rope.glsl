// Rotary position embedding on one row of heads, shared by span_rope.comp
// and the attention kernel that applies it itself in single-token decode
// (span_attention.comp with ROPE_FUSED). The include site declares
// `params[]`, the span's parameter buffer holding the cos/sin table.

// The two elements of rotation pair `j` (head j / half, index j % half)
// within a row of heads; neox: NeoX halves (i, i + n_rot/2), else adjacent
// pairs (2i, 2i+1).
uvec2 rope_pair(uint j, uint n_rot, uint head_dim, bool neox) {
    uint half_rot = n_rot / 2u;
    uint head = j / half_rot;
    uint i = j % half_rot;
    uint h0 = head * head_dim;
    if (neox) {
        return uvec2(h0 + i, h0 + i + half_rot);
    }
    return uvec2(h0 + 2u * i, h0 + 2u * i + 1u);
}

// (cos, sin) of pair j at `pos`; the table holds n_rot/2 pairs per position
// from float offset table_off.
vec2 rope_angle(uint table_off, uint pos, uint n_rot, uint j) {
    uint at = table_off + pos * n_rot + 2u * (j % (n_rot / 2u));
    return vec2(params[at], params[at + 1u]);
}

// The pair (x0, x1) rotated by the angle whose (cos, sin) is cs.
vec2 rope_rotate(float x0, float x1, vec2 cs) {
    return vec2(fma(x0, cs.x, -(x1 * cs.y)), fma(x0, cs.y, x1 * cs.x));
}
