// Chained decode stages (span/chain.rs): the dispatches of a one-token
// forward's layers are recorded without pipeline barriers between them, so
// that a stage's workgroups launch while the stage before is still
// finishing; the order the barriers kept is kept here instead. The chained
// stages of a forward are numbered from 0; every workgroup of stage s
// counts itself in at the stage's arrival counter when its stores are
// done, and the last to arrive sets the flag words to s + 1 (a stage can
// only finish after the one before it, so the flags count finished
// stages). A workgroup of stage s waits, before it reads anything, for the
// flags to reach s. Dispatches of one queue start their workgroups in
// submission order, so those of the stages it waits for are all running or
// done: a wait never holds a place they need.
//
// The chain words (zeroed at the start of every chained submit): word 0
// the failure word, then FLAG_COPIES copies of the flag, one line each (the
// waiting workgroups poll one copy each, so that no one line takes every
// poll), then one arrival counter per stage from COUNTER_BASE.
//
// `p.chain` is 0 for a dispatch outside a chain (no wait, no arrival), else
// 1 + its stage's number; `p.chain_groups` is the stage's workgroups (all
// its dispatches'). A wait that outlasts CHAIN_SPIN_LIMIT polls gives up
// and raises the failure word: the forward's results are then wrong, and
// the host runs it again with barriers.
//
// What a chained kernel reads after its wait that an earlier stage of the
// same submit wrote, it must read through bindings whose loads the acquire
// below orders (CHAIN_INPUT).
//
// The includer defines CHAIN_BINDING, declares `p.chain` and
// `p.chain_groups`, and enables GL_KHR_memory_scope_semantics.
layout(std430, binding = CHAIN_BINDING) buffer Chain { uint chain_words[]; };

const uint FLAG_COPIES = 32u;
const uint FLAG_STRIDE = 32u;
const uint COUNTER_BASE = FLAG_STRIDE * (1u + FLAG_COPIES);
// Polls before a wait gives up.
const uint CHAIN_SPIN_LIMIT = 1u << 20;

// Waits until the earlier stages are done. The polls are relaxed loads of
// the workgroup's copy of the flag (a busy loop between polls measured no
// better: the load's latency spaces them); one acquire then orders what
// the workgroup reads after the wait, and the control barrier passes it on
// to the whole workgroup (all of whose invocations call this in uniform
// control flow).
void chain_wait() {
    if (p.chain == 0u) {
        return;
    }
    uint stage = p.chain - 1u;
    if (gl_LocalInvocationIndex == 0u && stage != 0u) {
        uint wg = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
        uint flag = FLAG_STRIDE * (1u + wg % FLAG_COPIES);
        uint done = 0u;
        for (uint spins = 0u; spins < CHAIN_SPIN_LIMIT; spins++) {
            done = atomicLoad(chain_words[flag], gl_ScopeDevice, gl_StorageSemanticsNone,
                gl_SemanticsRelaxed);
            if (done >= stage) {
                break;
            }
            // A wait elsewhere already gave up: stop waiting.
            if ((spins & 1023u) == 0u
                && atomicLoad(chain_words[0], gl_ScopeDevice, gl_StorageSemanticsNone,
                    gl_SemanticsRelaxed) != 0u) {
                break;
            }
        }
        if (done < stage) {
            atomicStore(chain_words[0], 1u, gl_ScopeDevice, gl_StorageSemanticsNone,
                gl_SemanticsRelaxed);
        }
        memoryBarrier(gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquire);
    }
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer,
        gl_SemanticsAcquireRelease);
}

// The workgroup's stores are done: made available at device scope (the
// control barrier's release), then its arrival counted; the last of the
// stage to arrive has acquired every other's stores with its count, and
// releases them all with the flags.
void chain_arrive() {
    if (p.chain == 0u) {
        return;
    }
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer,
        gl_SemanticsAcquireRelease);
    if (gl_LocalInvocationIndex == 0u) {
        uint stage = p.chain - 1u;
        uint arrived = atomicAdd(chain_words[COUNTER_BASE + stage], 1u, gl_ScopeDevice,
            gl_StorageSemanticsBuffer, gl_SemanticsAcquireRelease);
        if (arrived + 1u == p.chain_groups) {
            // One release fence for all copies: a release store each would
            // wait for the memory system once per copy.
            memoryBarrier(gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelease);
            for (uint c = 0u; c < FLAG_COPIES; c++) {
                atomicStore(chain_words[FLAG_STRIDE * (1u + c)], stage + 1u, gl_ScopeDevice,
                    gl_StorageSemanticsNone, gl_SemanticsRelaxed);
            }
        }
    }
}
