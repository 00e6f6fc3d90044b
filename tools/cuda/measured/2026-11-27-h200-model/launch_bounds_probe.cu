#include <cstdio>
constexpr int kT = 16;
__global__ void __launch_bounds__(kT*kT) bounded(float* x) { x[threadIdx.x] = 1; }
int main() {
  float* x; cudaMalloc(&x, 4096);
  cudaFuncAttributes a; cudaFuncGetAttributes(&a, bounded);
  printf("maxThreadsPerBlock attr %d numRegs %d\n", a.maxThreadsPerBlock, a.numRegs);
  bounded<<<1, 256>>>(x); cudaError_t e = cudaGetLastError(); printf("256: %s\n", cudaGetErrorName(e));
  bounded<<<1, 512>>>(x); e = cudaGetLastError(); printf("512: %s: %s\n", cudaGetErrorName(e), cudaGetErrorString(e));
  e = cudaDeviceSynchronize(); printf("sync after: %s\n", cudaGetErrorName(e));
  bounded<<<1, dim3(16,32)>>>(x); e = cudaGetLastError(); printf("16x32: %s\n", cudaGetErrorName(e));
  return 0;
}
