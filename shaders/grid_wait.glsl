// The grid-wide waits of the persistent kernels (persistent_blocks.glsl,
// span_persistent_layer.comp): every workgroup counts its arrival after a
// phase, and a workgroup waits until all have arrived.
//
// The includer declares SPIN_LIMIT, the binding `arrivals[]` and the push
// constant `p.groups_x`, and enables GL_KHR_memory_scope_semantics. It may
// name the words of `arrivals` for the counter and the failure word
// (COUNTER_WORD, FAILURE_WORD; by default words 0 and 1).
#ifndef COUNTER_WORD
#define COUNTER_WORD 0u
#endif
#ifndef FAILURE_WORD
#define FAILURE_WORD 1u
#endif

// The phase is done here: the workgroup's invocations meet (a release at
// workgroup scope, so their stores happen before invocation 0's next
// step), then invocation 0 counts the workgroup's one arrival with a
// device-scope release, which by happens-before carries the others' stores
// too (the form of CUDA's grid sync). A device-scope release in every
// invocation, as this wait had, stalls each of them until all of its
// outstanding memory operations are done (H100 tg128: llama-8b 297 -> 308-313
// tok/s, llama-1b 1,004 -> 1,114-1,121 with this form and the relaxed polls
// below; docs/BENCHMARKS.md). The stores the kernels publish this way are
// to coherent buffers, available at device scope as they are made.
void arrive() {
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeWorkgroup, gl_StorageSemanticsBuffer,
        gl_SemanticsAcquireRelease);
    if (gl_LocalInvocationID.x == 0u) {
        atomicAdd(arrivals[COUNTER_WORD], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelease);
    }
}

// Whether a wait gave up (the failure word raised). A relaxed load names
// no storage semantics (VUID-StandaloneSpirv-MemorySemantics-10871).
bool failure_raised() {
    return atomicLoad(arrivals[FAILURE_WORD], gl_ScopeDevice, gl_StorageSemanticsNone, gl_SemanticsRelaxed) != 0u;
}

// Waits until every workgroup has arrived g times at the counter in word
// `counter`, after its dispatch's phase g - 1 (the counter starts at zero
// in each submission, so a dispatch of several phases comes first in it);
// a wait that gives up raises the failure word. Invocation 0 polls with
// relaxed loads (an acquire per poll cost every poll a fence) and acquires
// once after the loop, then the workgroup meets, which orders every
// invocation's later loads after that acquire.
void wait_on(uint counter, uint g) {
    if (gl_LocalInvocationID.x == 0u) {
        uint target = g * p.groups_x;
        uint arrived = 0u;
        for (uint spins = 0u; spins < SPIN_LIMIT; spins++) {
            arrived = atomicLoad(arrivals[counter], gl_ScopeDevice, gl_StorageSemanticsNone,
                gl_SemanticsRelaxed);
            if (arrived >= target) {
                break;
            }
            // A wait elsewhere already gave up: the forward is discarded,
            // so stop waiting (a wrong N then costs about one wait's spins
            // per forward instead of every wait's).
            if ((spins & 4095u) == 0u && failure_raised()) {
                break;
            }
        }
        // Judged by the count, not by the loop. (On llvmpipe, lavapipe, a
        // loop past 65535 iterations ends the invocation that runs it: its
        // later stores, arrivals and this flag included, never happen, so a
        // long wait there goes wrong silently; a wait split into nested
        // loops made it compute later code of this SIMD row wrongly. Grid
        // waits are for devices that keep every workgroup resident.)
        if (arrived < target) {
            arrivals[FAILURE_WORD] = 1u;
        }
        memoryBarrier(gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquire);
    }
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeWorkgroup, gl_StorageSemanticsBuffer,
        gl_SemanticsAcquireRelease);
}

// The wait at the counter of COUNTER_WORD.
void wait_for(uint g) {
    wait_on(COUNTER_WORD, g);
}
