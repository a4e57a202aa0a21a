#version 450
// Causal grouped-query attention over the device f16 KV cache for decode
// steps and short chunks, with each token's keys split into runs across
// workgroups: workgroup s of (head h, token t) attends to runs s,
// s + splits, ..., keeps each run's softmax state (max, sum, weighted value
// sums) as a partial, and the last of the token's workgroups to finish
// merges the partials in run order and writes the output (the
// last-arriver merge of coopmat_output.glsl's split matmuls).
//
// Why: a decode step's attention is a chain of dependent latencies (the
// token's place, its q/k/v, the cached keys, the softmax reductions, the
// cached values), and with one workgroup per head that chain grows with
// the context: on the H200 the single-workgroup kernel (span_attention.comp)
// took ~9 us per llama-8b layer at 128 positions against ~3 us for an empty
// dispatch. Here each workgroup loads its keys' and values' 16-byte words
// for a block of BK keys at once (LPT words of each per thread, issued
// together with the token's q/k/v), so a split of one block costs one
// round of loads.
//
// The splits of a token depend only on how many keys it attends to
// (`keys_per_split`), never on the chunk or on how many workgroups the
// dispatch gives it (`splits`: each takes every splits-th split), so a
// token gets the same bits in a decode step, a verification chunk and a
// batched step.
//
// With ROPE_FUSED the kernel also does RoPE and the KV store of its token:
// the workgroup of the run holding the token's own position rotates the
// key, writes the key and value rows into the cache and takes that row
// from shared memory instead of reading it back (no other workgroup reads
// it in this dispatch). The rotation is span_rope.comp's arithmetic and the row is
// taken as stored (f16), so the plain kernel reading the cache written by
// span_rope.comp gives the same bits.
//
// With WAIT_QKV (specialisation constant 0, set only on the ROPE_FUSED
// module, for one-token decode steps) there is no barrier between the q/k/v
// matvec and this dispatch: the matvec's workgroups count their rows in at
// their KV head's word of the step buffer after storing them
// (matvec_i8.comp count_qkv_rows), and each workgroup here waits for its KV
// head's q, k and v rows to have arrived, with its first block's cached
// keys and values already in flight, then reads them through a coherent
// binding. The attention of one KV head can so start while the matvec
// still computes the others' rows. A wait that spins past QKV_SPINS sets
// the failure flag in the host-visible step buffer (the host then runs the
// forward again with the barrier; tens of milliseconds of polls on a GPU).
// The arithmetic is the same, so the bits are.
//
// With `wo_count` non-zero (one-token steps whose wo matvec runs right after
// this dispatch with no barrier, matvec_i8.comp WAIT_X) the workgroup that
// writes a (token, head)'s output counts it in at that word of the step
// buffer; wo waits until every head has.
//
// Needs head_dim == head_dim_v, a multiple of 8 between 32 and 256, k_dim
// and v_dim multiples of 8 (host-checked), and subgroup arithmetic.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_memory_scope_semantics : require

#define WG 128u
#define MAX_HEAD_DIM 256u
// 16-byte key words (and as many value words) each thread loads per block.
#define LPT 4u
// The most splits a token's keys take (attention_split.rs MAX_SPLITS).
#define MAX_SPLITS 16u
layout(local_size_x = 128) in;

#include "span_common.glsl"
#include "handoff.glsl"

layout(constant_id = 0) const uint WAIT_QKV = 0u;
// Polls of a KV head's arrival word before a wait gives up.
#define QKV_SPINS 60000u

layout(std430, binding = 0) readonly buffer Qkv { float qkv[]; };
// q/k/v written by the matvec running beside this dispatch (WAIT_QKV).
layout(std430, binding = 0) coherent readonly buffer QkvLive { float qkv_live[]; };
// The step buffer's arrival words (span_common.glsl QKV_ARRIVALS_AT).
layout(std430, binding = 4) coherent buffer QkvArrivals { uint qkv_arrivals[]; };
// The host-visible step buffer: a wait that gives up sets its failure word
// there, which the host reads after the forward (span/step.rs
// STEP_DEVICE_WORDS).
layout(std430, binding = 8) coherent writeonly buffer WaitFailed { uint wait_failed[]; };
#if defined(ROPE_FUSED)
layout(std430, binding = 1) writeonly buffer KCacheW { uvec4 kc_w[]; };
layout(std430, binding = 2) writeonly buffer VCacheW { uvec4 vc_w[]; };
#endif
layout(std430, binding = 1) readonly buffer KCache4 { uvec4 kc4[]; };
layout(std430, binding = 2) readonly buffer VCache4 { uvec4 vc4[]; };
layout(std430, binding = 3) writeonly buffer Out { float attn[]; };
// The output in f16 instead (`quantise` 2), as span_attention.comp writes it.
layout(std430, binding = 3) writeonly buffer OutH4 { uvec4 attn_h4[]; };
// The output quantised for the int8 matvec (int8_acts.glsl), `quantise` 1.
// Coherent: with `wo_count` the wo matvec dispatched right after this one
// reads it as each head counts itself in.
layout(std430, binding = 6) coherent writeonly buffer Int8Acts { uint q8[]; };
#if defined(ROPE_FUSED)
// The span's parameters: the cos/sin table.
layout(std430, binding = 5) readonly buffer Params { float params[]; };
#endif
// The split scratch: one arrival counter per (token, head) of the dispatch
// (zeroed at the start of every submit, reset by each merge), then from
// float `part_base()` MAX_SPLITS partials per (token, head): max, sum, two
// unused floats, then the head_dim_v weighted value sums.
layout(std430, binding = 7) coherent buffer SplitCount { uint split_count[]; };
layout(std430, binding = 7) coherent buffer SplitPart { float split_part[]; };
layout(std430, binding = 7) coherent buffer SplitPart4 { vec4 split_part4[]; };

layout(push_constant) uniform Push {
    // As span_attention.comp.
    uint tok_base;
    uint n_head;
    uint n_head_kv;
    uint head_dim;
    uint head_dim_v;
    uint k_dim;
    uint v_dim;
    uint window;
    float scale;
    uint n_rot;
    uint neox;
    uint table_off;
    uint k_off;
    uint v_off;
    uint quantise;
    // Workgroups per (token, head) along x; workgroup s takes splits s,
    // s + splits, ... of its token (a performance choice: the splits and
    // their merge, so the bits, do not depend on it).
    uint splits;
    // Non-zero: the word of binding 4 (the step buffer) at which each
    // (token, head) counts itself in once its output is stored, for the wo
    // matvec that runs beside this dispatch (matvec_i8.comp WAIT_X); the
    // last waiter of each KV head counts it in at the word after once its
    // q/k/v has arrived.
    uint wo_count;
} p;

#define INT8_WRITER 1
#include "int8_acts.glsl"

#if defined(ROPE_FUSED)
#include "span_rope.glsl"
// The token's query (0) and key (1) head while they are rotated.
shared float head_buf[2][MAX_HEAD_DIM];
// The token's key and value rows as the cache holds them.
shared uvec4 new_k4[MAX_HEAD_DIM / 8u];
shared uvec4 new_v4[MAX_HEAD_DIM / 8u];
#endif

shared vec4 q4[MAX_HEAD_DIM / 4u];
// Partial dot products of a block's keys, one per 16-byte word of a row
// (BK * words = LPT * WG at most).
shared float key_part[LPT * WG];
// The block's softmax weights (BK <= WG keys).
shared float weight[WG];
// Per subgroup: the block's max (0) and sum of weights (1).
shared float sg_red[2][WG];
// Per thread: its weighted value sums (eight dimensions), then the merged
// output row.
shared vec4 partial4[2][WG];
// Whether this workgroup merges its token's splits (uniform after a barrier).
shared uint merge_here;

// Value i of q | k | v.
float qkv_at(uint i) {
    return WAIT_QKV != 0u ? qkv_live[i] : qkv[i];
}

// Waits until the q/k/v matvec has stored every q, k and v row of KV head
// g (WAIT_QKV); the last of its `waiters` workgroups to pass clears the
// head's words for the next layer. Invocation 0 polls with relaxed loads
// and acquires once (handoff.glsl), so the cached keys and values loaded
// before the wait stay in flight through it. Every thread must call it.
void wait_for_qkv(uint g, uint waiters) {
    if (gl_LocalInvocationID.x == 0u) {
        uint want = (p.n_head / p.n_head_kv) * p.head_dim + p.head_dim + p.head_dim_v;
        uint at = qkv_rows_word(g);
        uint seen = 0u;
        for (uint spins = 0u; spins < QKV_SPINS; spins++) {
            seen = atomicLoad(qkv_arrivals[at], gl_ScopeDevice, gl_StorageSemanticsNone,
                gl_SemanticsRelaxed);
            if (seen >= want) {
                break;
            }
        }
        // Judged by the count after the loop. (QKV_SPINS stays below 65535:
        // on llvmpipe, lavapipe, a longer loop ends the invocation that
        // runs it, this flag's store included; grid_wait.glsl.)
        if (seen < want) {
            wait_failed[QKV_FAILED_HOST_WORD] = 1u;
        }
        if (atomicAdd(qkv_arrivals[at + 1u], 1u) + 1u == waiters) {
            atomicExchange(qkv_arrivals[at], 0u);
            atomicExchange(qkv_arrivals[at + 1u], 0u);
            // The KV head's q/k/v has passed: the waiting wo may load.
            if (p.wo_count != 0u) {
                atomicAdd(qkv_arrivals[p.wo_count + 1u], 1u);
            }
        }
        handoff_acquire();
    }
    handoff_meet();
}

// Keys per split of a token attending to n_keys keys: whole blocks of BK
// keys (the blocks of heads of head_dim values), at least one, and at most
// MAX_SPLITS splits. It depends on nothing else (not on the dispatch's
// `splits`), so a token's partials and their merge are the same in every
// chunk and batch.
uint keys_per_split(uint n_keys) {
    uint bk = LPT * (WG / (p.head_dim / 8u));
    uint even = (n_keys + MAX_SPLITS - 1u) / MAX_SPLITS;
    return max(bk, (even + bk - 1u) / bk * bk);
}

// Float offset of the partials, past one counter per (token, head).
uint part_base() {
    return (gl_NumWorkGroups.y * p.n_head + 3u) / 4u * 4u;
}

// Float offset of the partial of split z of (token t, head h).
uint part_at(uint t, uint h, uint z) {
    return part_base() + ((t * p.n_head + h) * MAX_SPLITS + z) * (p.head_dim_v + 4u);
}

// The max (sg 0) or sum (sg 1) of v over the workgroup: each subgroup's,
// then the subgroups' in subgroup order. Every thread must call it; the
// slots are free again after the caller's next barrier.
float block_reduce(float v, uint sg) {
    float r = sg == 0u ? subgroupMax(v) : subgroupAdd(v);
    if (subgroupElect()) {
        sg_red[sg][gl_SubgroupID] = r;
    }
    barrier();
    float all = sg_red[sg][0];
    for (uint i = 1u; i < gl_NumSubgroups; i++) {
        all = sg == 0u ? max(all, sg_red[sg][i]) : all + sg_red[sg][i];
    }
    return all;
}

// Writes the token's output row from the merged sums held by threads
// tid < words (eight values each, in partial4[*][tid]) and, with
// `quantise` 1, its int8 copy. Every thread must call it (barrier).
void write_output(uint t, uint h) {
    uint tid = gl_LocalInvocationID.x;
    uint words = p.head_dim_v / 8u;
    if (tid < words) {
        vec4 lo = partial4[0][tid];
        vec4 hi = partial4[1][tid];
        uint o0 = (t * p.n_head + h) * p.head_dim_v + 8u * tid;
        if (p.quantise == 2u) {
            attn_h4[o0 / 8u] = uvec4(packHalf2x16(lo.xy), packHalf2x16(lo.zw),
                                     packHalf2x16(hi.xy), packHalf2x16(hi.zw));
        } else {
            for (uint c = 0u; c < 4u; c++) {
                attn[o0 + c] = lo[c];
                attn[o0 + 4u + c] = hi[c];
            }
        }
    }
    if (p.quantise == 1u) {
        barrier();
        if (tid < p.head_dim_v / 32u) {
            vec4 v[8];
            for (uint k = 0u; k < 4u; k++) {
                v[2u * k] = partial4[0][4u * tid + k];
                v[2u * k + 1u] = partial4[1][4u * tid + k];
            }
            store_int8_block(v, t, h * (p.head_dim_v / 32u) + tid, p.n_head * p.head_dim_v);
        }
    }
}

// Counts this (token, head) in at the wo matvec's word once its output is
// stored (`wo_count` non-zero). Every thread must call it (barrier).
void count_output() {
    if (p.wo_count == 0u) {
        return;
    }
    handoff_meet();
    if (gl_LocalInvocationID.x == 0u) {
        handoff_release();
        atomicAdd(qkv_arrivals[p.wo_count], 1u);
    }
}

// A thread's place in each pass over a block of keys (main sets them):
// key kq of the pass, word c of the key's row, and the cache word of that
// column in the KV head (keys and values have heads of one width).
uint kq;
uint c;
bool in_pass;
uint kv_word;

// Loads this thread's cached key and value words of the block of keys from
// key0 (LPT passes of per_pass keys; keys at or past cached_end are not
// loaded) into rk and rv.
void load_block(inout uvec4 rk[LPT], inout uvec4 rv[LPT], uint key0, uint cached_end,
                uint per_pass, uint row0) {
    uint k_row4 = p.k_dim / 8u;
    uint v_row4 = p.v_dim / 8u;
    [[unroll]] for (uint i = 0u; i < LPT; i++) {
        uint key = key0 + i * per_pass + kq;
        if (in_pass && key < cached_end) {
            rk[i] = kc4[(row0 + key) * k_row4 + kv_word];
            rv[i] = vc4[(row0 + key) * v_row4 + kv_word];
        }
    }
}

void main() {
    uint h = gl_WorkGroupID.x / p.splits;
    uint s = gl_WorkGroupID.x % p.splits;
    uint t = gl_WorkGroupID.y;
    uint tid = gl_LocalInvocationID.x;
    uvec2 place = token_place(p.tok_base + t);
    uint pos = place.x;
    uint row0 = place.y;
    uint kv_head = h / (p.n_head / p.n_head_kv);
    uint first = (p.window > 0u && pos + 1u > p.window) ? pos + 1u - p.window : 0u;
    uint end = pos + 1u;

    // Thread (key kq, word c) of each pass over a block: a row's words go
    // to consecutive threads, so the loads of a subgroup coalesce. The
    // same thread sums word c of the values of the same keys.
    uint words = p.head_dim / 8u;
    uint per_pass = WG / words;
    uint bk = LPT * per_pass;
    c = tid % words;
    kq = tid / words;
    in_pass = kq < per_pass;

    // The token's splits; this workgroup takes splits s, s + p.splits, ...
    uint n_keys = end - first;
    uint kps = keys_per_split(n_keys);
    uint n_split = (n_keys + kps - 1u) / kps;
    if (s >= n_split) {
        return;
    }
    uint k_row4 = p.k_dim / 8u;
    uint v_row4 = p.v_dim / 8u;
    kv_word = kv_head * words + c;
    // The split holding the token's own key (the last).
    uint last = n_split - 1u;
#if defined(ROPE_FUSED)
    // Its workgroup stores that key and value, and takes them from shared
    // memory instead of the cache.
    bool stores = last % p.splits == s;
#endif

    // The first split's first block, in flight with the token's own loads.
    uvec4 rk[LPT];
    uvec4 rv[LPT];
    {
        uint k_begin = first + s * kps;
        uint k_end = min(k_begin + kps, end);
#if defined(ROPE_FUSED)
        uint cached_end = s == last ? pos : k_end;
#else
        uint cached_end = k_end;
#endif
        load_block(rk, rv, k_begin, cached_end, per_pass, row0);
    }
#if defined(ROPE_FUSED)
    // The rotation's (cos, sin) of thread j's pair, in flight before any
    // wait for q/k/v (it needs only the position).
    vec2 rope_cs = vec2(1.0, 0.0);
    if (tid < p.head_dim / 2u && tid < p.n_rot / 2u) {
        rope_cs = rope_angle(p.table_off, pos, p.n_rot, tid);
    }
#endif
    if (WAIT_QKV != 0u) {
        // Every head of the KV head waits, each with the workgroups its
        // splits take.
        wait_for_qkv(kv_head, (p.n_head / p.n_head_kv) * min(n_split, p.splits));
    }

#if defined(ROPE_FUSED)
    {
        // Thread j rotates pair j of the query head (and of the key head in
        // the storing workgroup); pairs past n_rot / 2 are the unrotated rest.
        uint q0 = (t * p.n_head + h) * p.head_dim;
        uint k0 = p.k_off + t * p.k_dim + kv_head * p.head_dim;
        uint v0 = p.v_off + t * p.v_dim + kv_head * p.head_dim_v;
        uint half_rot = p.n_rot / 2u;
        uint j = tid;
        bool pair = j < p.head_dim / 2u;
        uvec2 ab = j < half_rot ? rope_pair(j, p.n_rot, p.head_dim, p.neox != 0u)
                                : uvec2(2u * j, 2u * j + 1u);
        float qa = 0.0, qb = 0.0, ka = 0.0, kb = 0.0;
        vec2 cs = vec2(1.0, 0.0);
        vec4 va = vec4(0.0), vb = vec4(0.0);
        if (pair) {
            qa = qkv_at(q0 + ab.x);
            qb = qkv_at(q0 + ab.y);
            if (stores) {
                ka = qkv_at(k0 + ab.x);
                kb = qkv_at(k0 + ab.y);
            }
            if (j < half_rot) {
                cs = rope_cs;
            }
        }
        if (stores && tid < words) {
            for (uint e = 0u; e < 4u; e++) {
                va[e] = qkv_at(v0 + 8u * tid + e);
                vb[e] = qkv_at(v0 + 8u * tid + 4u + e);
            }
        }
        if (pair) {
            vec2 rq = vec2(qa, qb);
            vec2 rk2 = vec2(ka, kb);
            if (j < half_rot) {
                rq = rope_rotate(qa, qb, cs);
                rk2 = rope_rotate(ka, kb, cs);
            }
            head_buf[0][ab.x] = rq.x;
            head_buf[0][ab.y] = rq.y;
            head_buf[1][ab.x] = rk2.x;
            head_buf[1][ab.y] = rk2.y;
        }
        barrier();
        if (tid < words) {
            uint e = 8u * tid;
            q4[2u * tid] = vec4(head_buf[0][e], head_buf[0][e + 1u], head_buf[0][e + 2u], head_buf[0][e + 3u]);
            q4[2u * tid + 1u] = vec4(head_buf[0][e + 4u], head_buf[0][e + 5u], head_buf[0][e + 6u], head_buf[0][e + 7u]);
            if (stores) {
                uvec4 kw = uvec4(packHalf2x16(vec2(head_buf[1][e], head_buf[1][e + 1u])),
                                 packHalf2x16(vec2(head_buf[1][e + 2u], head_buf[1][e + 3u])),
                                 packHalf2x16(vec2(head_buf[1][e + 4u], head_buf[1][e + 5u])),
                                 packHalf2x16(vec2(head_buf[1][e + 6u], head_buf[1][e + 7u])));
                uvec4 vw = uvec4(packHalf2x16(va.xy), packHalf2x16(va.zw),
                                 packHalf2x16(vb.xy), packHalf2x16(vb.zw));
                new_k4[tid] = kw;
                new_v4[tid] = vw;
                kc_w[(row0 + pos) * k_row4 + kv_head * words + tid] = kw;
                vc_w[(row0 + pos) * v_row4 + kv_head * words + tid] = vw;
            }
        }
        barrier();
    }
#else
    {
        uint q0 = (t * p.n_head + h) * p.head_dim;
        if (tid < p.head_dim / 4u) {
            q4[tid] = vec4(qkv[q0 + 4u * tid], qkv[q0 + 4u * tid + 1u],
                           qkv[q0 + 4u * tid + 2u], qkv[q0 + 4u * tid + 3u]);
        }
        barrier();
    }
#endif

    vec4 qa = q4[2u * c];
    vec4 qb = q4[2u * c + 1u];
    uint counter = t * p.n_head + h;
    for (uint z = s; z < n_split; z += p.splits) {
        uint k_begin = first + z * kps;
        uint k_end = min(k_begin + kps, end);
#if defined(ROPE_FUSED)
        bool own_row = z == last;
        uint cached_end = own_row ? pos : k_end;
#else
        uint cached_end = k_end;
#endif
        vec4 acc_lo = vec4(0.0);
        vec4 acc_hi = vec4(0.0);
        float m = -1.0 / 0.0;
        float l = 0.0;
        for (uint key0 = k_begin; key0 < k_end; key0 += bk) {
            uint n_block = min(bk, k_end - key0);
            if (key0 != k_begin || z != s) {
                load_block(rk, rv, key0, cached_end, per_pass, row0);
            }
#if defined(ROPE_FUSED)
            // The token's own row, as stored.
            [[unroll]] for (uint i = 0u; i < LPT; i++) {
                uint key = key0 + i * per_pass + kq;
                if (own_row && in_pass && key == pos) {
                    rk[i] = new_k4[c];
                    rv[i] = new_v4[c];
                }
            }
#endif
            // Partial products, then each key's sum in word order (the
            // order of a one-thread dot product).
            [[unroll]] for (uint i = 0u; i < LPT; i++) {
                uint k = i * per_pass + kq;
                if (in_pass && k < n_block) {
                    vec2 k0 = unpackHalf2x16(rk[i].x);
                    vec2 k1 = unpackHalf2x16(rk[i].y);
                    vec2 k2 = unpackHalf2x16(rk[i].z);
                    vec2 k3 = unpackHalf2x16(rk[i].w);
                    key_part[k * words + c] = dot(qa, vec4(k0, k1)) + dot(qb, vec4(k2, k3));
                }
            }
            barrier();
            float score = -1.0 / 0.0;
            if (tid < n_block) {
                float d = 0.0;
                for (uint j = 0u; j < words; j++) {
                    d += key_part[tid * words + j];
                }
                score = d * p.scale;
            }
            float m_new = max(m, block_reduce(score, 0u));
            float e = tid < n_block ? exp(score - m_new) : 0.0;
            weight[tid] = e;
            float correction = exp(m - m_new);
            l = l * correction + block_reduce(e, 1u);
            // block_reduce's barrier made every weight visible.
            acc_lo *= correction;
            acc_hi *= correction;
            [[unroll]] for (uint i = 0u; i < LPT; i++) {
                uint k = i * per_pass + kq;
                if (in_pass && k < n_block) {
                    float wt = weight[k];
                    acc_lo += wt * vec4(unpackHalf2x16(rv[i].x), unpackHalf2x16(rv[i].y));
                    acc_hi += wt * vec4(unpackHalf2x16(rv[i].z), unpackHalf2x16(rv[i].w));
                }
            }
            m = m_new;
            barrier();
        }

        // The key groups' value sums, merged in group order.
        partial4[0][tid] = in_pass ? acc_lo : vec4(0.0);
        partial4[1][tid] = in_pass ? acc_hi : vec4(0.0);
        barrier();
        vec4 lo = vec4(0.0);
        vec4 hi = vec4(0.0);
        if (tid < words) {
            lo = partial4[0][tid];
            hi = partial4[1][tid];
            for (uint g = 1u; g < per_pass; g++) {
                lo += partial4[0][g * words + tid];
                hi += partial4[1][g * words + tid];
            }
        }
        barrier();
        if (n_split == 1u) {
            if (tid < words) {
                partial4[0][tid] = lo / l;
                partial4[1][tid] = hi / l;
            }
            barrier();
            write_output(t, h);
            count_output();
            return;
        }
        // Keep this split's state for the merge.
        uint at = part_at(t, h, z);
        if (tid == 0u) {
            split_part[at] = m;
            split_part[at + 1u] = l;
        }
        if (tid < words) {
            split_part4[at / 4u + 1u + 2u * tid] = lo;
            split_part4[at / 4u + 2u + 2u * tid] = hi;
        }
    }

    // Count this workgroup's splits in; the last to arrive merges them all
    // in split order.
    // (handoff.glsl: invocation 0's count is the release of the workgroup's
    // partials and, for the last to arrive, the acquire of the others'.)
    handoff_meet();
    if (tid == 0u) {
        uint mine = (n_split - s + p.splits - 1u) / p.splits;
        uint arrived = atomicAdd(split_count[counter], mine, gl_ScopeDevice,
            gl_StorageSemanticsBuffer, gl_SemanticsAcquireRelease);
        merge_here = arrived + mine == n_split ? 1u : 0u;
    }
    handoff_meet();
    if (merge_here == 0u) {
        return;
    }
    if (tid == 0u) {
        split_count[counter] = 0u;
    }
    if (tid < words) {
        float m_all = -1.0 / 0.0;
        for (uint z = 0u; z < n_split; z++) {
            m_all = max(m_all, split_part[part_at(t, h, z)]);
        }
        float l_all = 0.0;
        vec4 lo = vec4(0.0);
        vec4 hi = vec4(0.0);
        for (uint z = 0u; z < n_split; z++) {
            uint a = part_at(t, h, z);
            float f = exp(split_part[a] - m_all);
            l_all += split_part[a + 1u] * f;
            lo += split_part4[a / 4u + 1u + 2u * tid] * f;
            hi += split_part4[a / 4u + 2u + 2u * tid] * f;
        }
        partial4[0][tid] = lo / l_all;
        partial4[1][tid] = hi / l_all;
    }
    barrier();
    write_output(t, h);
    count_output();
}
