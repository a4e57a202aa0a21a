#version 450
// Measurement only (the persistent_chain bench of fish-vk): a chain of
// dependent Q4_K matvecs run by ONE dispatch of resident workgroups with a
// grid-wide barrier between them, the shape a persistent span kernel would
// take, to compare with the same matvecs as dependent dispatches
// (matvec_serial) and back to back (matvec). Matvec m multiplies copy
// m % p.y_stride of the weights (p.n_rows rows each, consecutive in one
// buffer) by the output of matvec m - 1: x and y alternate between
// bindings 1 and 2, read coherently (they are rewritten within the
// dispatch). Workgroups take blocks of ROWS rows in turn (p.groups_x of
// them, all resident); p.n_tok is the chain's length. The arrival counter
// is the word after x at binding 1 (zeroed before the dispatch).
//
// With PREFETCH (module persistent_matvec_probe_prefetch) each workgroup
// copies x into shared memory once per matvec, and loads the weights of
// its first block of the next matvec before the grid-wide barrier, so they
// stream while it waits: the form a persistent span kernel would take.
// Rows of at most PREFETCH_UNITS * WG units (4096 Q4_K values).
//
// With L1_X as well (module persistent_matvec_probe_prefetch_l1) x is
// staged through the ordinary, L1-cached loads, as a kernel that writes
// every stage's output to fresh addresses could read it. Here the two
// vectors are rewritten in place, so the values may be stale: a timing
// probe only.
//
// With PRELOAD_ALL (module persistent_matvec_probe_preload) every subgroup
// owns a row (rows r, r + subgroups of the dispatch, ...) and holds ALL of
// its first row's units in registers (the heads spread over the lanes),
// loaded after its stores' fence and before the grid-wide barrier
// that precedes the matvec: with a row per subgroup the whole next matrix
// is in flight while the workgroups wait, so the dependency costs the
// barrier, x's staging and the sums, not the weights' latency. Rows of at
// most PRELOAD_UNITS units per lane (4096 Q4_K values at 32 lanes); 256
// invocations per workgroup.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#if defined(PRELOAD_ALL)
#extension GL_KHR_shader_subgroup_shuffle : require
#endif

#define TYPE_Q4_K
#if defined(PRELOAD_ALL)
layout(local_size_x = 256) in;
const uint WG = 256u;
#else
layout(local_size_x = 64) in;
const uint WG = 64u;
#endif
const uint ROWS = 4u;

#include "common.glsl"
layout(std430, binding = 0) readonly buffer Weights4 { uvec4 w4[]; };
#include "dequant.glsl"
#include "matvec_units.glsl"

layout(std430, binding = 1) coherent buffer VecA { vec4 a4[]; };
layout(std430, binding = 1) coherent buffer VecA1 { float a1[]; };
layout(std430, binding = 1) volatile buffer Arrivals { uint arrivals[]; };
layout(std430, binding = 2) coherent buffer VecB { vec4 b4[]; };
layout(std430, binding = 2) coherent buffer VecB1 { float b1[]; };

const uint SPIN_LIMIT = 1u << 22;

// One partial sum per subgroup (subgroups are at least 4 lanes wide).
shared float partial[ROWS][WG / 4u];


#if defined(PREFETCH)
const uint PREFETCH_UNITS = 2u;
shared vec4 xs[PREFETCH_UNITS * WG * UNIT_VALUES / 4u];

// The units of rows row0.. of the matrix starting at row copy_row0 that
// this thread takes (units past the row's end reload its last one).
void load_block(out Unit un[PREFETCH_UNITS][ROWS], uint copy_row0, uint row0, uint n_units) {
    for (uint k = 0u; k < PREFETCH_UNITS; k++) {
        uint u = min(gl_LocalInvocationID.x + k * WG, n_units - 1u);
        for (uint r = 0u; r < ROWS; r++) {
            un[k][r] = load_unit((copy_row0 + row0 + r) * p.row_stride, u);
        }
    }
}
#endif

vec4 input4(bool from_a, uint i) {
    if (from_a) {
        return a4[i];
    }
    return b4[i];
}

#if defined(L1_X)
layout(std430, binding = 1) readonly buffer VecAr { vec4 ar4[]; };
layout(std430, binding = 2) readonly buffer VecBr { vec4 br4[]; };

vec4 staged4(bool from_a, uint i) {
    if (from_a) {
        return ar4[i];
    }
    return br4[i];
}
#else
vec4 staged4(bool from_a, uint i) {
    return input4(from_a, i);
}
#endif

// Adds run `run` of unit `un` (values at x4 index xr..xr+3 of x) to acc.
void add_run(inout float acc, Unit un, uint run, vec4 x0, vec4 x1, vec4 x2, vec4 x3, float xsum) {
    vec4 q[4];
    float scale;
    float minv;
    decode_run(un, run, q, scale, minv);
    float s = (dot(q[0], x0) + dot(q[1], x1)) + (dot(q[2], x2) + dot(q[3], x3));
    acc += scale * s + minv * xsum;
}

// Reduces the block's sums over the workgroup and writes rows row0.. of
// the output (the vector not read this matvec); every invocation calls it.
void store_block(float acc[ROWS], uint row0, bool from_a) {
    uint tid = gl_LocalInvocationID.x;
    for (uint r = 0u; r < ROWS; r++) {
        float s = subgroupAdd(acc[r]);
        if (subgroupElect()) {
            partial[r][gl_SubgroupID] = s;
        }
    }
    barrier();
    if (tid < ROWS) {
        float s = 0.0;
        for (uint j = 0u; j < gl_NumSubgroups; j++) {
            s += partial[tid][j];
        }
        // Scaled down so that the chain stays finite.
        if (from_a) {
            b1[row0 + tid] = s * 1e-3;
        } else {
            a1[row0 + tid] = s * 1e-3;
        }
    }
    barrier();
}

// The grid-wide barrier after matvec m: every workgroup's rows of it are
// written before any workgroup reads them in matvec m + 1.
void grid_barrier(uint m) {
    if (gl_LocalInvocationID.x == 0u) {
        uint counter = p.n_in;
        memoryBarrierBuffer();
        atomicAdd(arrivals[counter], 1u);
        uint target = (m + 1u) * p.groups_x;
        for (uint spins = 0u; arrivals[counter] < target && spins < SPIN_LIMIT; spins++) {
        }
        memoryBarrierBuffer();
    }
    barrier();
}

#if defined(PRELOAD_ALL)
const uint PRELOAD_UNITS = 4u;
shared vec4 xs[4096u / 4u];

// Lane l's k-th unit is l + k * lanes (a load of all lanes reads one
// contiguous stretch of qs). Its head, one of the row's n_units / 8
// super-blocks' 16-byte heads, is held spread over the lanes: lane l keeps
// words HEAD_WORDS * l .. of the row's heads (word i = word i % 4 of
// super-block i / 4), so a head costs HEAD_WORDS registers per lane, not
// four per unit, and reaches its lanes by shuffles.
const uint HEAD_WORDS = 2u;

// Loads row `row` of the matrix starting at row copy_row0: this lane's
// units' qs and its share of the row's head words.
void load_row(out uvec4 qs[PRELOAD_UNITS], out uint heads[HEAD_WORDS], uint copy_row0, uint row, uint per_lane) {
    uint lane = gl_SubgroupInvocationID;
    uint row_byte = (copy_row0 + row) * p.row_stride;
    for (uint k = 0u; k < PRELOAD_UNITS; k++) {
        uint u = lane + min(k, per_lane - 1u) * gl_SubgroupSize;
        qs[k] = w4[(row_byte + u / 8u * BLOCK_BYTES) / 16u + QS_OFFSET / 16u + u % 8u];
    }
    uint n_words = 4u * (p.n_in / BLOCK_VALUES);
    for (uint j = 0u; j < HEAD_WORDS; j++) {
        uint i = min(HEAD_WORDS * lane + j, n_words - 1u);
        heads[j] = w[(row_byte + i / 4u * BLOCK_BYTES) / 4u + i % 4u];
    }
}

// The head of super-block sb from the lanes that hold it.
uvec4 head_of(uint heads[HEAD_WORDS], uint sb) {
    uvec4 h;
    for (uint c = 0u; c < 4u; c++) {
        uint i = 4u * sb + c;
        uint from_lane = i / HEAD_WORDS;
        // Every lane takes part in each shuffle (the word index is uniform).
        uint w0 = subgroupShuffle(heads[0], from_lane);
        uint w1 = subgroupShuffle(heads[1], from_lane);
        h[c] = (i % HEAD_WORDS) == 0u ? w0 : w1;
    }
    return h;
}

// The grid-wide barrier of this variant: the workgroup's stores were made
// available before its loads ahead were issued (so no fence here waits
// for those loads); one invocation counts the arrival and polls.
void grid_barrier_after_fence(uint m) {
    barrier();
    if (gl_LocalInvocationID.x == 0u) {
        uint counter = p.n_in;
        atomicAdd(arrivals[counter], 1u);
        uint target = (m + 1u) * p.groups_x;
        for (uint spins = 0u; arrivals[counter] < target && spins < SPIN_LIMIT; spins++) {
        }
        memoryBarrierBuffer();
    }
    barrier();
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint n_units = p.n_in / UNIT_VALUES;
    uint per_lane = n_units / gl_SubgroupSize;
    uint lanes_rows = p.groups_x * gl_NumSubgroups;
    uint row_first = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID;
    uvec4 qs[PRELOAD_UNITS];
    uint heads[HEAD_WORDS];
    if (row_first < p.n_rows) {
        load_row(qs, heads, 0u, row_first, per_lane);
    }
    for (uint m = 0u; m < p.n_tok; m++) {
        bool from_a = (m & 1u) == 0u;
        uint copy_row0 = (m % p.y_stride) * p.n_rows;
        for (uint i = tid; i < p.n_in / 4u; i += WG) {
            xs[i] = input4(from_a, i);
        }
        barrier();
        for (uint row = row_first; row < p.n_rows; row += lanes_rows) {
            if (row != row_first) {
                load_row(qs, heads, copy_row0, row, per_lane);
            }
            float acc = 0.0;
            for (uint k = 0u; k < PRELOAD_UNITS; k++) {
                if (k >= per_lane) {
                    break;
                }
                uint u = gl_SubgroupInvocationID + k * gl_SubgroupSize;
                Unit unit;
                // Uniform per k only where a subgroup's lanes share a
                // super-block's heads: the shuffles take each lane's own.
                unit.head = head_of(heads, u / 8u);
                unit.qs = qs[k];
                unit.c = (u % 8u) / 2u;
                for (uint run = 0u; run < RUNS; run++) {
                    uint xr = run_x4(u, run);
                    vec4 x0 = xs[xr];
                    vec4 x1 = xs[xr + 1u];
                    vec4 x2 = xs[xr + 2u];
                    vec4 x3 = xs[xr + 3u];
                    float xsum = dot((x0 + x1) + (x2 + x3), vec4(1.0));
                    add_run(acc, unit, run, x0, x1, x2, x3, xsum);
                }
            }
            float s = subgroupAdd(acc);
            if (subgroupElect()) {
                // Scaled down so that the chain stays finite.
                if (from_a) {
                    b1[row] = s * 1e-3;
                } else {
                    a1[row] = s * 1e-3;
                }
            }
        }
        // This invocation's stores available before its loads ahead, so
        // that the fence does not wait for them.
        memoryBarrierBuffer();
        // The next matvec's rows stream in during the barrier.
        if (m + 1u < p.n_tok && row_first < p.n_rows) {
            load_row(qs, heads, ((m + 1u) % p.y_stride) * p.n_rows, row_first, per_lane);
        }
        grid_barrier_after_fence(m);
    }
}
#elif defined(PREFETCH)
void main() {
    uint tid = gl_LocalInvocationID.x;
    uint n_units = p.n_in / UNIT_VALUES;
    uint first_block = gl_WorkGroupID.x * ROWS;
    Unit un[PREFETCH_UNITS][ROWS];
    if (first_block < p.n_rows) {
        load_block(un, 0u, first_block, n_units);
    }
    for (uint m = 0u; m < p.n_tok; m++) {
        bool from_a = (m & 1u) == 0u;
        uint copy_row0 = (m % p.y_stride) * p.n_rows;
        for (uint i = tid; i < p.n_in / 4u; i += WG) {
            xs[i] = staged4(from_a, i);
        }
        barrier();
        for (uint row0 = first_block; row0 < p.n_rows; row0 += p.groups_x * ROWS) {
            if (row0 != first_block) {
                load_block(un, copy_row0, row0, n_units);
            }
            float acc[ROWS];
            for (uint r = 0u; r < ROWS; r++) {
                acc[r] = 0.0;
            }
            for (uint k = 0u; k < PREFETCH_UNITS; k++) {
                uint u = tid + k * WG;
                if (u >= n_units) {
                    break;
                }
                for (uint run = 0u; run < RUNS; run++) {
                    uint xr = run_x4(u, run);
                    vec4 x0 = xs[xr];
                    vec4 x1 = xs[xr + 1u];
                    vec4 x2 = xs[xr + 2u];
                    vec4 x3 = xs[xr + 3u];
                    float xsum = dot((x0 + x1) + (x2 + x3), vec4(1.0));
                    for (uint r = 0u; r < ROWS; r++) {
                        add_run(acc[r], un[k][r], run, x0, x1, x2, x3, xsum);
                    }
                }
            }
            store_block(acc, row0, from_a);
        }
        // The next matvec's first block streams in during the barrier.
        if (m + 1u < p.n_tok && first_block < p.n_rows) {
            load_block(un, ((m + 1u) % p.y_stride) * p.n_rows, first_block, n_units);
        }
        grid_barrier(m);
    }
}
#else
void main() {
    uint tid = gl_LocalInvocationID.x;
    uint n_units = p.n_in / UNIT_VALUES;
    for (uint m = 0u; m < p.n_tok; m++) {
        bool from_a = (m & 1u) == 0u;
        uint copy_row0 = (m % p.y_stride) * p.n_rows;
        for (uint row0 = gl_WorkGroupID.x * ROWS; row0 < p.n_rows; row0 += p.groups_x * ROWS) {
            float acc[ROWS];
            for (uint r = 0u; r < ROWS; r++) {
                acc[r] = 0.0;
            }
            for (uint u = tid; u < n_units; u += WG) {
                Unit un[ROWS];
                for (uint r = 0u; r < ROWS; r++) {
                    un[r] = load_unit((copy_row0 + row0 + r) * p.row_stride, u);
                }
                for (uint run = 0u; run < RUNS; run++) {
                    uint xr = run_x4(u, run);
                    vec4 x0 = input4(from_a, xr);
                    vec4 x1 = input4(from_a, xr + 1u);
                    vec4 x2 = input4(from_a, xr + 2u);
                    vec4 x3 = input4(from_a, xr + 3u);
                    float xsum = dot((x0 + x1) + (x2 + x3), vec4(1.0));
                    for (uint r = 0u; r < ROWS; r++) {
                        add_run(acc[r], un[r], run, x0, x1, x2, x3, xsum);
                    }
                }
            }
            store_block(acc, row0, from_a);
        }
        grid_barrier(m);
    }
}
#endif
