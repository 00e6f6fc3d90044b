// Checks that the CUDA part of the library links and finds the GPU. Without a device it
// prints one line starting "skipped:" and CTest reports the test as skipped.
#include "device_main.hpp"

int main() {
    return run_on_device([] { return 0; });
}
