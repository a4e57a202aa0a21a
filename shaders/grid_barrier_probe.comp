#version 450
// Measurement only (the grid_barrier bench of fish-vk): what a grid-wide
// barrier between the workgroups of one dispatch costs, the step a
// persistent span kernel would take between dependent stages instead of a
// pipeline barrier (docs/GPU.md, "What a decode stage costs"). Each of
// p.groups workgroups (the caller launches no more than the device keeps
// resident at once) runs p.rounds rounds; in each, one invocation adds one
// to the arrival counter and polls it until every workgroup has arrived:
// one poller per workgroup. A wait that outlasts SPIN_LIMIT polls gives up
// (the measured time then shows it).
layout(local_size_x = 64) in;

// The matmul layout's binding 1 (x), zeroed before the timed dispatch.
layout(std430, binding = 1) volatile buffer Arrivals { uint arrived[]; };

// Read through the matmul kernels' push constants: n_in, then groups_x.
layout(push_constant) uniform Probe {
    uint rounds;
    uint unused[5];
    uint groups;
} p;

const uint SPIN_LIMIT = 1u << 22;

void main() {
    for (uint r = 1u; r <= p.rounds; r++) {
        if (gl_LocalInvocationIndex == 0u) {
            memoryBarrierBuffer();
            atomicAdd(arrived[0], 1u);
            uint target = r * p.groups;
            for (uint spins = 0u; arrived[0] < target && spins < SPIN_LIMIT; spins++) {
            }
            memoryBarrierBuffer();
        }
        barrier();
    }
}
