// rule: host code reaches device memory only through the runtime's copies, never through a device pointer
// refused: host code wrote device memory, byte 12 of a cudaMalloc allocation of 64 bytes
#include "mistake.hpp"

// On a GPU the pointer cudaMalloc returns is an address in the device's memory: the host
// writing through it faults (or, with unified addressing, writes somewhere it should not).
// The simulator keeps device memory in the host's, so it closes it to host code between its
// own calls (the device guard) to see the store. The store ends the program, so it runs in a
// child process.
MISTAKE(host_writes_device_memory) {
    return mistakes::said_by_child([] {
        cuda_sim::set_device_guard(true);
        float* device = nullptr;
        cudaMalloc(&device, 16 * sizeof(float));
        device[3] = 1.0f;  // a device pointer used as a host one
        cudaDeviceSynchronize();
    });
}
