// The per-thread sums of the matvec kernels and their reduction: one sum per
// row and token of the workgroup, reduced with subgroup arithmetic
// (USE_SUBGROUP) or through shared memory, then stored by store_y.
// Needs WG, ROWS and NT (specialisation constants) and common.glsl.

#if defined(GATE_UP)
// The gate/up matvec sums ROWS gate rows, then the same ROWS rows of up,
// and stores act(gate) * up per row (matvec.comp).
const uint SUM_ROWS = 2u * ROWS;
#else
const uint SUM_ROWS = ROWS;
#endif

float acc[SUM_ROWS][NT];

#if defined(USE_SUBGROUP)
// One partial sum per subgroup (subgroups are at least 4 lanes wide).
shared float partial[SUM_ROWS * NT][WG / 4u];
#else
shared float partial[SUM_ROWS * NT][WG];
#endif

void clear_sums() {
    for (uint r = 0u; r < SUM_ROWS; r++) {
        for (uint t = 0u; t < NT; t++) {
            acc[r][t] = 0.0;
        }
    }
}

// Reduces the sums of rows row0.. and tokens t0.. over the workgroup and
// stores them; every thread must call it (it has barriers).
void store_sums(uint row0, uint t0) {
    uint tid = gl_LocalInvocationID.x;
#if defined(USE_SUBGROUP)
    for (uint r = 0u; r < SUM_ROWS; r++) {
        for (uint t = 0u; t < NT; t++) {
            float s = subgroupAdd(acc[r][t]);
            if (subgroupElect()) {
                partial[r * NT + t][gl_SubgroupID] = s;
            }
        }
    }
    uint n_partials = gl_NumSubgroups;
#else
    for (uint r = 0u; r < SUM_ROWS; r++) {
        for (uint t = 0u; t < NT; t++) {
            partial[r * NT + t][tid] = acc[r][t];
        }
    }
    uint n_partials = WG;
#endif
    barrier();
    for (uint i = tid; i < ROWS * NT; i += WG) {
        uint r = i / NT;
        uint t = i % NT;
        if (row0 + r < p.n_rows && t0 + t < p.n_tok) {
            float s = 0.0;
            for (uint j = 0u; j < n_partials; j++) {
                s += partial[i][j];
            }
#if defined(GATE_UP)
            // Row r's up sum is item (ROWS + r) * NT + t.
            float up = 0.0;
            for (uint j = 0u; j < n_partials; j++) {
                up += partial[i + ROWS * NT][j];
            }
            s = gated_act(s, GELU) * up;
#endif
#if defined(RESNORM)
            store_residual_and_normed(i, row0 + r, t0 + t, s);
        } else {
            residual_sq[i] = 0.0;
#else
            store_y((t0 + t) * p.y_stride + p.y_offset + row0 + r, s);
#endif
        }
    }
    barrier();
#if defined(RESNORM)
    store_sums_of_squares(row0, t0);
    barrier();
#endif
}
