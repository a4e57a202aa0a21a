// Shared by the span kernels: f16 access to the KV cache, which is bound as
// uint[] with two f16 values per word so that no 16-bit storage feature is
// needed, and where each token of a forward sits.

float kv_load(uint word, uint e) {
    vec2 pair = unpackHalf2x16(word);
    return (e & 1u) == 0u ? pair.x : pair.y;
}

// The step buffer, written by the host before each submit so that a recorded
// command buffer serves every position: word 0 is the forward's first
// position, word 1 the layout. Layout 0 (one sequence): token t sits at
// position word0 + t of the slot whose first KV row is word 2 (0 for slot
// 0). Layout 1 (a batch of independent sequences): token t sits at position
// words[STEP_HEADER_WORDS + 2t] of the slot whose first KV row is
// words[STEP_HEADER_WORDS + 2t + 1].
#define STEP_HEADER_WORDS 4u
layout(std430, binding = 4) readonly buffer Step { uint step_words[]; };

// Past the step words (span/step.rs QKV_ARRIVALS_AT), zeroed at the start
// of every submit that overlaps: the overlapped decode attention's words
// (the q/k/v matvec counts its rows in, the attention waits for them; see
// span_attention_split.comp WAIT_QKV): per KV head g its rows arrived
// (4 + 2g) and its waiters passed (5 + 2g); then one word per layer of the
// span at which the attention counts its heads in for the wo matvec beside
// it (`wo_count`, span/step.rs WO_ARRIVALS_AT), two per layer (its heads'
// outputs, its KV heads past their q/k/v). The host-visible copy holds
// the failure flag (a wait that gave up) past them, at QKV_FAILED_HOST_WORD.
#define QKV_ARRIVALS_AT 160u
#define QKV_FAILED_HOST_WORD (QKV_ARRIVALS_AT + 4u + 2u * 64u + 2u * 256u)
uint qkv_rows_word(uint g) { return QKV_ARRIVALS_AT + 4u + 2u * g; }

// (position, first KV row of the token's slot) of token t of the forward.
uvec2 token_place(uint t) {
    if (step_words[1] == 0u) {
        return uvec2(step_words[0] + t, step_words[2]);
    }
    uint at = STEP_HEADER_WORDS + 2u * t;
    return uvec2(step_words[at], step_words[at + 1u]);
}
