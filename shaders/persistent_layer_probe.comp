#version 450
// Measurement only (the persistent_layer bench of fish-vk): the matvecs of
// p.n_tok llama decode layers in ONE dispatch of resident workgroups, with a
// grid-wide barrier between dependent phases, to measure what a persistent
// span kernel would cost per layer against today's dependent dispatches.
//
// A layer is four Q4_K phases, each reading the output of the one before:
// q/k/v (n_q + 2 n_q / 4 rows of n_embd values: four query heads per
// key-value head), wo (n_embd x n_embd), gate/up (2 n_ff x n_embd) and down
// (n_embd x n_ff). Attention and the activation are left out (wo reads the
// first n_embd q/k/v outputs, down the first n_ff gate/up outputs), so the
// probe holds the weight streaming and the dependencies only. Layer l uses
// weight copy l % p.row_stride; a copy is the four matrices one after
// another in one buffer.
//
// Phase g (4 l + stage) reads vector slot g and writes slot g + 1 (binding
// 1, after the arrival counter's 64 words; p.y_stride floats apart), each
// output scaled by 1 / sqrt(n_in) so that the chain stays finite. Every
// slot is written once per dispatch, so its lines were never cached before
// the phase that reads them: with L1_X the inputs come through ordinary
// (L1-cached) loads, as a span kernel writing every phase to fresh
// addresses could read them; without, through coherent ones.
//
// A phase's rows are cut into blocks; block b belongs to workgroup
// b % p.groups_x. Each invocation holds up to MAXU units (matvec_units.glsl)
// of a block: the units lane, lane + TPR, ... of its rows, where TPR
// invocations share a row. The phase's input is staged into shared memory
// as f16 pairs once per phase.
//
// With AHEAD the units of a workgroup's next block are loaded before its
// current block is summed, across phases too: the first block of the next
// phase streams in while the workgroup sums its last block, stores it and
// waits at the grid-wide barrier. Without, each block is loaded and then
// summed, as today's kernels do. WIDE_BLOCKS doubles the units of a block.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_memory_scope_semantics : require

#define TYPE_Q4_K
layout(local_size_x = 128) in;
const uint WG = 128u;
// Units per invocation and block: with WIDE_BLOCKS twice as many, so twice
// the weight bytes in flight per workgroup.
#if defined(WIDE_BLOCKS)
const uint MAXU = 8u;
#else
const uint MAXU = 4u;
#endif
// The longest input (n_ff) the shared x holds (llama-8b's; 28 KB as f16
// pairs, under the 32 KB of shared memory every device offers).
const uint MAX_IN = 14336u;

#include "common.glsl"
layout(std430, binding = 0) readonly buffer Weights4 { uvec4 w4[]; };
#include "dequant.glsl"
#include "matvec_units.glsl"

layout(std430, binding = 1) coherent buffer Slots { float slot_c[]; };
layout(std430, binding = 1) coherent buffer Slots4 { vec4 slot_c4[]; };
layout(std430, binding = 1) readonly buffer SlotsR4 { vec4 slot_r4[]; };
layout(std430, binding = 1) volatile buffer Arrivals { uint arrivals[]; };

// Words before slot 0 (the arrival counter and padding).
const uint SLOT0 = 64u;
const uint SPIN_LIMIT = 1u << 22;

shared uint xs[MAX_IN / 2u];
// Per row of a block and subgroup of its invocations: partial sums (rows
// per block x subgroups per row = WG * rows per invocation / subgroup size,
// for subgroups of 4 or more).
shared float partial[WG * MAXU / 4u];

// A phase: its rows, input length and first weight byte.
struct Phase {
    uint rows;
    uint n_in;
    uint byte0;
};

uint row_bytes(uint n_in) {
    return n_in / 256u * BLOCK_BYTES;
}

Phase phase_of(uint g) {
    uint e = p.n_in;
    uint f = p.n_rows;
    uint stage = g % 4u;
    uint l = g / 4u;
    uint qkv_rows = e + e / 2u;
    uint copy_bytes = (qkv_rows + e + 2u * f) * row_bytes(e) + e * row_bytes(f);
    uint base = (l % p.row_stride) * copy_bytes;
    Phase ph;
    if (stage == 0u) {
        ph = Phase(qkv_rows, e, base);
    } else if (stage == 1u) {
        ph = Phase(e, e, base + qkv_rows * row_bytes(e));
    } else if (stage == 2u) {
        ph = Phase(2u * f, e, base + (qkv_rows + e) * row_bytes(e));
    } else {
        ph = Phase(e, f, base + (qkv_rows + e + 2u * f) * row_bytes(e));
    }
    return ph;
}

#include "persistent_blocks.glsl"

uint blocks_of(Phase ph, Cut c) {
    return (ph.rows + c.rb - 1u) / c.rb;
}

void load_block(out Unit un[MAXU], uint g, uint b) {
    Phase ph = phase_of(g);
    Cut c = cut_of(ph.n_in);
    uint rb = row_bytes(ph.n_in);
    for (uint k = 0u; k < MAXU; k++) {
        uint row;
        uint unit;
        bool valid;
        slot_place(ph, c, b, k, row, unit, valid);
        un[k] = load_unit(ph.byte0 + row * rb, unit);
    }
}

// The work item after (g, b) of this workgroup: the next block of phase g,
// or its first block of a later phase (g == 4 n_tok: none).
void next_item(inout uint g, inout uint b) {
    b += p.groups_x;
    while (g < 4u * p.n_tok && b >= blocks_of(phase_of(g), cut_of(phase_of(g).n_in))) {
        g += 1u;
        b = gl_WorkGroupID.x;
    }
}

uint slot_word(uint g) {
    return SLOT0 + g * p.y_stride;
}

// Loads of the staging a thread issues together (a loop of one load at a
// time would wait a latency each).
const uint STAGE_LOADS = 8u;

void stage_x(uint g, uint n_in) {
    uint base4 = slot_word(g) / 4u;
    uint quads = n_in / 4u;
    for (uint q0 = gl_LocalInvocationID.x; q0 < quads; q0 += STAGE_LOADS * WG) {
        vec4 v[STAGE_LOADS];
        for (uint k = 0u; k < STAGE_LOADS; k++) {
            uint q = base4 + min(q0 + k * WG, quads - 1u);
#if defined(L1_X)
            v[k] = slot_r4[q];
#else
            v[k] = slot_c4[q];
#endif
        }
        for (uint k = 0u; k < STAGE_LOADS; k++) {
            uint q = q0 + k * WG;
            if (q < quads) {
                xs[2u * q] = packHalf2x16(v[k].xy);
                xs[2u * q + 1u] = packHalf2x16(v[k].zw);
            }
        }
    }
    barrier();
}

// Sums block b of phase g from its units and stores it into slot g + 1.
void sum_block(Unit un[MAXU], uint g, uint b) {
    Phase ph = phase_of(g);
    uint row;
    float s;
    if (block_sum(un, ph, b, row, s)) {
        slot_c[slot_word(g + 1u) + row] = s * inversesqrt(float(ph.n_in));
    }
    barrier();
}

void main() {
    uint phases = 4u * p.n_tok;
    // This workgroup's first item.
    uint g = 0u;
    uint b = gl_WorkGroupID.x;
    if (b >= blocks_of(phase_of(0u), cut_of(p.n_in))) {
        b -= p.groups_x;
        next_item(g, b);
    }
    Unit cur[MAXU];
#if defined(AHEAD)
    if (g < phases) {
        load_block(cur, g, b);
    }
#endif
    for (uint ph = 0u; ph < phases; ph++) {
        if (ph > 0u) {
            wait_for(ph);
        }
        if (g == ph) {
            stage_x(ph, phase_of(ph).n_in);
        }
        while (g == ph) {
            uint ng = g;
            uint nb = b;
            next_item(ng, nb);
#if defined(AHEAD)
            Unit nxt[MAXU];
            if (ng < phases) {
                load_block(nxt, ng, nb);
            }
            sum_block(cur, g, b);
            cur = nxt;
#else
            load_block(cur, g, b);
            sum_block(cur, g, b);
#endif
            g = ng;
            b = nb;
        }
        arrive();
    }
}
