// Hand-offs between workgroups through a counter in a coherent buffer:
// writers store, then count themselves in; a reader polls the counter, then
// reads what the writers stored. (The persistent kernels' grid-wide waits,
// grid_wait.glsl, are the same pattern over a whole dispatch.)
//
// Only invocation 0 of a workgroup takes the device-scope release or
// acquire; the workgroup meets at a workgroup-scope barrier on its side of
// it, which by happens-before carries the other invocations' stores to the
// release and the acquire to their later loads (the form of CUDA's
// cooperative-groups sync). A device-scope fence in every invocation, as
// memoryBarrierBuffer() is, makes each of them wait until all of its own
// outstanding memory operations are done, the loads it issued ahead of the
// wait included; that serialised the weights or keys in flight with the
// reads after the wait. The stores published this way go to coherent
// buffers, available at device scope as they are made.
//
// The includer enables GL_KHR_memory_scope_semantics.

// The workgroup's invocations meet: every buffer and shared-memory access
// before it happens before every one after it, in any invocation.
void handoff_meet() {
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeWorkgroup,
        gl_StorageSemanticsBuffer | gl_StorageSemanticsShared, gl_SemanticsAcquireRelease);
}

// Invocation 0, after handoff_meet and before its relaxed atomic count-in:
// the workgroup's stores happen before the count.
void handoff_release() {
    memoryBarrier(gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelease);
}

// Invocation 0, after its relaxed polls saw the count and before
// handoff_meet: the writers' stores happen before the workgroup's loads.
void handoff_acquire() {
    memoryBarrier(gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquire);
}
