// mma.cuh's PTX primitives on a GPU: the checks the CUDA simulator's model passes
// (tests/cuda_sim/test_cuda_sim_mma.cpp, up to its simulator-only part), run on the hardware,
// so that the model's fragment layouts and the GPU's answer to the same expectations.
// mma.sync m16n8k16 and cp.async need compute capability 8.0; without such a GPU the test
// says "skipped:".
#define DOCTEST_CONFIG_IMPLEMENT
#include "../cuda_sim/test_cuda_sim_mma.cpp"

#include <cstdio>

int main(int argc, char** argv) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::printf("skipped: no CUDA device\n");
        return 0;
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major < 8) {
        std::printf("skipped: mma.sync m16n8k16 and cp.async need compute capability 8.0 or later\n");
        return 0;
    }
    doctest::Context context(argc, argv);
    return context.run();
}
