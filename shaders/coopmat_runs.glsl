// Runs of four weight groups (32 values of one row) fetched at once, for
// the per-subgroup staging of matmul_coopmat_stream.comp, whose steps are
// multiples of 64 values:
//     RUN_GROUP(kr, i)                           group i of run kr of a step, from the step's first group
//     RawRun run_fetch(uint row_byte, uint g0)   the run whose group 0 is g0
//     RawGroup run_group(RawRun r, uint i)       its group i as raw_fetch loads it
// so raw_decode (coopmat_raw.glsl, included first) gives the same values.
//
// The four groups of a run share most of their words: a K-quant run has
// one block head (or d and one scale word) and 16 or 32 contiguous quant
// bytes, which take two or three 16-byte loads here against 24 scalar
// loads through raw_fetch (on the H200 +12% for the per-subgroup batch
// tile, llama-8b B = 8). Types without a dedicated run keep four raw_fetch
// groups.

#if defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
// A run is the 16 qs bytes 32c + 16v .. + 15 of chunk c (steps are
// multiples of 64 values, so a step holds whole chunks): their low nibbles
// are groups 8c + 2v, 8c + 2v + 1 (sub-block 2c), their high nibbles groups
// 8c + 2v + 4, 8c + 2v + 5 (sub-block 2c + 1). With the block head that is
// two 16-byte loads for 32 values (Q5_K: a third for its 16 qh bytes).
#define RUN_GROUP(kr, i) (8u * ((kr) >> 1) + 2u * ((kr) & 1u) + ((i) & 1u) + 4u * ((i) >> 1))
struct RawRun {
    uvec4 head;
    uvec4 q;
#if defined(TYPE_Q5_K)
    uvec4 qh;
#endif
};

RawRun run_fetch(uint row_byte, uint g0) {
    RawRun r;
    uint blk = g0 / GROUPS_PER_BLOCK;
    uint k = g0 - blk * GROUPS_PER_BLOCK;
    uint block_byte = row_byte + blk * BLOCK_BYTES;
    uint half16 = 16u * ((k >> 1) & 1u);
    r.head = raw_w4[block_byte >> 4];
    r.q = raw_w4[(block_byte + QS_OFFSET + 32u * (k >> 3) + half16) >> 4];
#if defined(TYPE_Q5_K)
    r.qh = raw_w4[(block_byte + QH_OFFSET + half16) >> 4];
#endif
    return r;
}

RawGroup run_group(RawRun r, uint i) {
    RawGroup g;
    g.v[0] = r.head.x;
    g.v[1] = r.head.y;
    g.v[2] = r.head.z;
    g.v[3] = r.head.w;
    uvec2 q = (i & 1u) == 0u ? r.q.xy : r.q.zw;
    g.v[4] = q.x;
    g.v[5] = q.y;
#if defined(TYPE_Q5_K)
    uvec2 qh = (i & 1u) == 0u ? r.qh.xy : r.qh.zw;
    g.v[6] = qh.x;
    g.v[7] = qh.y;
#endif
    return g;
}

#elif defined(TYPE_Q6_K)
// Four consecutive groups: they share d, quarter qq's 32 ql bytes, the
// half's 32 qh bytes and one scale word (scale bytes 8n + 2qq and 8n + 2qq + 1).
#define RUN_GROUP(kr, i) (4u * (kr) + (i))

// Words 2i and 2i + 1 of a 32-byte stretch held as two uvec4.
uvec2 word_pair(uvec4 a, uvec4 b, uint i) {
    uvec4 v = i < 2u ? a : b;
    return (i & 1u) == 0u ? v.xy : v.zw;
}

struct RawRun {
    uint d;
    uvec4 ql[2];
    uvec4 qh[2];
    uint sc;
};

RawRun run_fetch(uint row_byte, uint g0) {
    RawRun r;
    Q6Group q = q6_group(row_byte, g0);
    r.d = q.d_word;
    uint l16 = (q.block_byte + 64u * q.n + 32u * (q.qq & 1u)) >> 4;
    r.ql[0] = raw_w4[l16];
    r.ql[1] = raw_w4[l16 + 1u];
    uint h16 = (q.block_byte + 128u + 32u * q.n) >> 4;
    r.qh[0] = raw_w4[h16];
    r.qh[1] = raw_w4[h16 + 1u];
    r.sc = w[(q.block_byte + 192u + 8u * q.n + 2u * q.qq) >> 2];
    return r;
}

RawGroup run_group(RawRun r, uint i) {
    RawGroup g;
    g.v[0] = r.d;
    uvec2 ql = word_pair(r.ql[0], r.ql[1], i);
    uvec2 qh = word_pair(r.qh[0], r.qh[1], i);
    g.v[1] = ql.x;
    g.v[2] = ql.y;
    g.v[3] = qh.x;
    g.v[4] = qh.y;
    g.v[5] = r.sc;
    return g;
}

#elif defined(TYPE_FQ3)
#define RUN_GROUP(kr, i) (4u * (kr) + (i))
// The run's groups share the C word and the block head; the first two take
// the A plane's word, the last two the B plane's.
struct RawRun {
    uint a;
    uint b;
    uint c;
    uvec4 head;
};

RawRun run_fetch(uint row_byte, uint g0) {
    RawRun r;
    uint blk = g0 / GROUPS_PER_BLOCK;
    uint k = g0 - blk * GROUPS_PER_BLOCK;
    uint nb = blocks_per_row();
    uint a_word = row_byte / 4u + 8u * blk + (k >> 2);
    r.a = w[a_word];
    r.b = w[a_word + 8u * nb];
    r.c = w[a_word + 16u * nb];
    r.head = raw_w4[(row_byte + 96u * nb + 16u * blk) >> 4];
    return r;
}

RawGroup run_group(RawRun r, uint i) {
    RawGroup g;
    g.v[0] = i < 2u ? r.a : r.b;
    g.v[1] = r.c;
    g.v[2] = r.head.x;
    g.v[3] = r.head.y;
    g.v[4] = r.head.z;
    g.v[5] = r.head.w;
    return g;
}

#else
#define RUN_GROUP(kr, i) (4u * (kr) + (i))
struct RawRun {
    RawGroup g[4];
};

RawRun run_fetch(uint row_byte, uint g0) {
    RawRun r;
    for (uint i = 0u; i < 4u; i++) {
        r.g[i] = raw_fetch(row_byte, g0 + i);
    }
    return r;
}

RawGroup run_group(RawRun r, uint i) {
    return r.g[i];
}
#endif
