// How finished fragments of the cooperative-matrix kernels leave
// (write_fragment), and the split of a dispatch's steps across
// workgroups (split_k.rs, push constants split / split_count_off /
// split_part_off): the `split` workgroups of an output tile, consecutive
// along y, each multiply a share of the steps; emit keeps a finished value
// as this workgroup's partial tile in the scratch at binding 3, and
// finish_split lets the last workgroup to arrive sum the partials in split
// order and write y. Included by matmul_coopmat.comp and
// matmul_coopmat_stream.comp after their tile constants (BM, BN, FM, FN,
// TM, TN, LANES, THREADS), common.glsl's push constants and store_y,
// coopmat_frag.glsl and the globals tile_y and split_z. With
// TENSOR_STORES only the split path is wanted: matmul_coopmat2.comp's tile
// leaves through tensor stores and matmul_frags.comp's through emit, not
// write_fragment.

// The split scratch: arrival counters, then partial tiles, coherent so that
// the last workgroup of a tile reads the others' writes.
layout(std430, binding = 3) coherent buffer SplitCounts { uint split_count[]; };
layout(std430, binding = 3) coherent buffer SplitParts { float split_part[]; };
// Whether this workgroup arrived last at its tile (uniform after a barrier).
shared uint split_last;

// The output tile's index within the dispatch and the float index of
// element e (column-major: e % BM the row, e / BM the token) of split z's
// partial of it.
uint tile_index() {
    return tile_y * p.groups_x + gl_WorkGroupID.x;
}
uint partial_index(uint z, uint e) {
    uint tiles = p.groups_x * (gl_NumWorkGroups.y / p.split);
    return p.split_part_off + (z * tiles + tile_index()) * (BM * BN) + e;
}

// One finished value of y (row and tok inside the matrix): stored, or with
// a split kept as this workgroup's partial.
void emit(uint row, uint tok, float v) {
    if (p.split > 1u) {
        uint e = (tok - tile_y * BN) * BM + (row - gl_WorkGroupID.x * BM);
        split_part[partial_index(split_z, e)] = v;
    } else {
        store_y(tok * p.y_stride + p.y_offset + row, v);
    }
}

// After every partial is out: count this workgroup in; the last of the
// tile's p.split sums the partials in split order and writes y. Every
// invocation must call it (barriers).
void finish_split() {
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
        uint arrived = atomicAdd(split_count[p.split_count_off + tile_index()], 1u);
        split_last = arrived + 1u == p.split ? 1u : 0u;
    }
    barrier();
    if (split_last == 0u) {
        return;
    }
    memoryBarrierBuffer();
    for (uint e = gl_LocalInvocationIndex; e < BM * BN; e += THREADS) {
        uint row = gl_WorkGroupID.x * BM + e % BM;
        uint tok = tile_y * BN + e / BM;
        if (row < p.n_rows && tok < p.n_tok) {
            float s = 0.0;
            for (uint z = 0u; z < p.split; z++) {
                s += split_part[partial_index(z, e)];
            }
            store_y(tok * p.y_stride + p.y_offset + row, s);
        }
    }
    if (gl_LocalInvocationIndex == 0u) {
        split_count[p.split_count_off + tile_index()] = 0u;
    }
}

#if !defined(TENSOR_STORES)
// Writes accumulator fragment f (row block f / FN, token block f % FN of
// the subgroup) to y through the subgroup's slot of buf_c at c_base.
void write_fragment(Acc c, uint f, uint c_base, uint lane, uint warp_m, uint warp_n) {
    uint fm = f / FN;
    uint fn = f % FN;
    uint row0 = gl_WorkGroupID.x * BM + (warp_m * FM + fm) * TM;
    uint tok0 = tile_y * BN + (warp_n * FN + fn) * TN;
    STORE_C(c, c_base);
    SUBGROUP_SYNC();
    for (uint e = lane; e < TM * TN; e += LANES) {
        uint row = row0 + e % TM;
        uint tok = tok0 + e / TM;
        if (row < p.n_rows && tok < p.n_tok) {
            emit(row, tok, buf_c[c_base + e]);
        }
    }
    SUBGROUP_SYNC();
}
#endif
