// A CUDA simulator: the part of CUDA's device language, runtime and cuBLAS that the course's
// kernels use, on the CPU, so that the same .cu files compile as plain C++ and run (and are
// tested) on a machine without a GPU.
//
// How it maps CUDA onto the CPU:
//   - A launch runs its blocks one after another on the calling thread.
//   - Inside a block every CUDA thread is a fiber (ucontext): its own stack, run until it
//     reaches a barrier or returns, then the next thread runs. threadIdx, blockIdx, blockDim
//     and gridDim are thread_local variables set before each fiber is resumed.
//   - __syncthreads() parks the thread until every thread of the block has reached the same
//     __syncthreads(); a barrier that some threads never reach (they returned, or wait at
//     another barrier) is reported as a launch failure, never a hang.
//   - A warp shuffle is a barrier of the warp's 32 lanes: each lane leaves its value in a
//     slot, and once all lanes are there each one reads the slot of its source lane.
//     __syncwarp, the tensor cores' WMMA calls (cuda_sim_wmma.hpp) and PTX's mma.sync and
//     ldmatrix (cuda_sim_mma.hpp, through ../mma.cuh) are warp-collective the same way:
//     every lane must reach the same call, and the last one to arrive does the warp's work
//     (a load, a matrix product) for all of them. Between collectives each lane runs on its
//     own, as a GPU's independent thread scheduling lets it.
//   - __shared__ is `static thread_local`: one copy per OS thread, which runs one block at a
//     time, so all threads of a block (fibers on that OS thread) share it. The program's
//     symbol table gives each kernel's static __shared__ variables (their sizes count
//     against the limits, and they are refilled with NaN bytes for each block). Dynamic
//     shared memory (ATTN_DYNAMIC_SHARED) is a per-launch buffer of the requested size.
//   - Device memory is host memory at the end of whole pages of its own, an inaccessible
//     page on either side, so that running past either end stops the program with a line
//     naming the kernel (in the sanitizer build, from the allocator, exactly as long as
//     asked, so AddressSanitizer sees every access), filled
//     with 0xff bytes (NaN floats) when allocated, as a GPU leaves it uninitialised. With the
//     device guard (set_device_guard) it is inaccessible to host code outside the
//     simulator's own calls.
//     A launch whose pointer arguments point outside device (or cudaMallocHost) memory is
//     refused, naming the argument: on a GPU the kernel would fault on it.
//   - Streams: the legacy stream and blocking streams run each call when it is made; a
//     non-blocking stream queues its kernels, copies, memsets, event records and cuBLAS
//     calls and runs them when it is synchronised (cudaStreamSynchronize, an event on it,
//     cudaDeviceSynchronize, cudaFree), as a GPU may run them late. A copy, memset or kernel
//     on the legacy stream that touches an allocation such queued work uses is refused
//     (cudaErrorIllegalState, naming both): the legacy stream does not wait for it. Pinned
//     memory (cudaMallocHost) that a queued copy will write is inaccessible until the copy
//     runs, and read-only where a queued copy will read it: host code touching it ends the
//     program with one line naming the copy, as a GPU would hand it stale or mixed data.
//   - Race check (CUDA_SIM_RACECHECK=1): a launch runs twice, threads and blocks in forward
//     then in reverse order, from the same device memory; any byte of device memory that
//     differs between the two runs is a race (or an atomic whose order matters), and so is
//     a block whose shared memory ends with other bytes in the two runs. Each
//     kernel is checked on its 1st, 2nd, 4th, 8th, … launch at each grid and block shape.
//     The first of the two runs also looks for lost updates: after each thread's segment
//     (up to a barrier, a shuffle or its end) the bytes it changed in the memory the launch
//     can write are its writes, and two threads writing one byte with nothing to order
//     them (between the same two barriers of a block, or in two blocks) is refused, though
//     one-at-a-time execution gave the right result; atomics are told apart (atomicAdd).
//
//   - Work counting (set_work_counting): what each launch reads, writes and (for cuBLAS and
//     the tensor cores) computes, for a performance model (attn/roofline.hpp); see Work.
//
// What it cannot show: speed (only a model's bound), the memory model between threads that
// are not ordered by a barrier (it runs them one at a time), bank conflicts, the real
// cuBLAS; the full list, and the catalogue of mistakes it refuses, is in README.md beside
// this file.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// ---------------------------------------------------------------------------------------
// The device language.

#define __global__
#define __device__
#define __host__
#define __forceinline__
#define __launch_bounds__(...)
#define __shared__ static thread_local

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1)
        : x(x_), y(y_), z(z_) {}
};

// A 16-byte aligned vector, loaded in one instruction on a GPU (a misaligned address faults
// there; UndefinedBehaviorSanitizer reports it here).
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
constexpr int warpSize = 32;

namespace cuda_sim {
void syncthreads(const char* file, int line);
// Leaves `bits` (the value's bytes) in this lane's slot, waits for the warp, returns the
// bytes of lane `source` (or this lane's own, as CUDA does, when `source` is out of range).
std::uint64_t shuffle(unsigned mask, std::uint64_t bits, int source, bool own, const char* file,
                      int line);
int lane_id();
void* dynamic_shared_memory();
// PTX's cp.async (mma.cuh): a copy of `bytes` (4, 8 or 16) from device to shared memory that
// lands only when cp_async_wait_group covers its group (its destination holds NaN bytes till
// then); commit_group closes this thread's group of copies; wait_group(n) completes all its
// committed groups but the n newest.
void cp_async(void* dst, const void* src, std::size_t bytes, const char* file, int line);
void cp_async_commit_group();
void cp_async_wait_group(int newest_pending);
// A warp-collective operation: every lane of the warp calls it at the same place (file,
// line) with its own `lane_arg`; when the last lane arrives, `op` runs once with the 32
// lanes' arguments (indexed by lane) and returns "" or what is wrong (then the launch
// fails with it); then every lane goes on. A lane that never arrives, or arrives at another
// collective, fails the launch as a deadlock would hang a GPU. `what` names the call.
void warp_collective(const char* what, void* lane_arg, std::string (*op)(void* const* lane_args),
                     const char* file, int line);

template <class T>
T shfl(unsigned mask, T v, int source, bool own, const char* file, int line) {
    static_assert(sizeof(T) <= 8, "shuffles move values of at most 8 bytes");
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = shuffle(mask, bits, source, own, file, line);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}
// The source lanes, with CUDA's rules for a width below 32.
inline int xor_source(int lane, int mask, int width) {
    const int s = lane ^ mask;
    return s / width > lane / width ? lane : s;  // a later group: the lane keeps its value
}
}  // namespace cuda_sim

#define __syncthreads() ::cuda_sim::syncthreads(__FILE__, __LINE__)

namespace cuda_sim {
inline std::string no_work(void* const*) { return ""; }
}  // namespace cuda_sim
// Waits for the lanes of the warp (the course's kernels pass the whole warp's mask).
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
    if (mask != 0xffffffffu) {
        ::cuda_sim::warp_collective("__syncwarp with a partial mask", nullptr,
                                    [](void* const*) -> std::string {
                                        return "the course's kernels synchronise whole warps "
                                               "(mask 0xffffffff)";
                                    },
                                    file, line);
        return;
    }
    ::cuda_sim::warp_collective("__syncwarp", nullptr, ::cuda_sim::no_work, file, line);
}
#define __shfl_xor_sync(...) ::cuda_sim::shfl_xor_(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) ::cuda_sim::shfl_down_(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_sync(...) ::cuda_sim::shfl_idx_(__FILE__, __LINE__, __VA_ARGS__)

namespace cuda_sim {
template <class T>
T shfl_xor_(const char* file, int line, unsigned mask, T v, int lane_mask, int width = 32) {
    const int lane = lane_id();
    const int s = xor_source(lane, lane_mask, width);
    return shfl(mask, v, s, s == lane, file, line);
}
template <class T>
T shfl_down_(const char* file, int line, unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = lane_id();
    const bool own = lane % width + static_cast<int>(delta) >= width;
    return shfl(mask, v, own ? lane : lane + static_cast<int>(delta), own, file, line);
}
template <class T>
T shfl_idx_(const char* file, int line, unsigned mask, T v, int src, int width = 32) {
    const int lane = lane_id();
    return shfl(mask, v, lane / width * width + ((src % width) + width) % width, false, file, line);
}
}  // namespace cuda_sim

// Blocks run one at a time on one OS thread: an atomic is a plain read-modify-write.
namespace cuda_sim {
// The race check's lost-update search is told which bytes an atomic wrote.
void note_atomic(const void* address, std::size_t bytes);
}  // namespace cuda_sim
template <class T>
inline T atomicAdd(T* address, T value) {
    cuda_sim::note_atomic(address, sizeof(T));
    const T old = *address;
    *address = old + value;
    return old;
}

// Device math. CUDA's expf, logf, erff and rsqrtf are within 2, 1, 2 and 2 units in the last
// place (ulp) of the exact result (CUDA C++ Programming Guide, "Mathematical Functions",
// single precision); here they are libm's, which is exact or nearly. Bitwise agreement with
// the CPU here does not carry to a GPU. With CUDA_SIM_DEVICE_MATH=ulp each result moves by a
// whole number of ulp within CUDA's bound, drawn from the argument's bits (the same argument
// gives the same result, as on a GPU), so a test run that way shows its tolerance does not
// rest on libm's bits.
//
// The special values do not move: a GPU gives them exactly. The CUDA Math API (libdevice
// User's Guide, __nv_expf, __nv_logf, __nv_erff, __nv_rsqrtf) lists expf(±0) = 1,
// expf(−inf) = +0, expf(+inf) = +inf; logf(1) = +0, logf(±0) = −inf, logf(+inf) = +inf,
// logf(x < 0) = NaN; erff(±0) = ±0, erff(±inf) = ±1; rsqrtf(±0) = ±inf, rsqrtf(+inf) = +0,
// rsqrtf(x < 0) = NaN; NaN gives NaN. The PTX instructions they are built on list the same
// in their special-value tables (PTX ISA 8.x, docs.nvidia.com/cuda/parallel-thread-execution,
// section 9.7.3 "Floating Point Instructions": 9.7.3.21 ex2, ex2.approx.f32: −Inf → +0.0,
// ±0.0 → +1.0, +Inf → +Inf, NaN → NaN; 9.7.3.20 lg2, lg2.approx.f32: −Inf and −normal → NaN,
// ±0.0 → −Inf, +Inf → +Inf, NaN → NaN; 9.7.3.16 rsqrt, rsqrt.approx.f32: −Inf and −normal →
// NaN, −0.0 → −Inf, +0.0 → +Inf, +Inf → +0.0, NaN → NaN. The numbers move between versions
// of the ISA; the anchors #floating-point-instructions-ex2, -lg2 and -rsqrt do not). sqrtf is
// not perturbed: CUDA's is IEEE-rounded (sqrt.rn.f32, 9.7.3.15). A subnormal argument of expf
// gives 1, the correctly rounded e^x (the .ftz forms flush it to 0, and give 1 as well).
// So a zero, infinite or NaN result is kept (move_ulp), and so are
// expf(±0 or subnormal) = 1 and erff(±inf) = ±1; a moved result stays in its function's
// range (it never reaches or crosses 0, and |erff| never passes 1).
namespace cuda_sim {
bool device_math_perturbed();
void set_device_math_perturbed(bool on);  // as CUDA_SIM_DEVICE_MATH=ulp (true) or exact
float move_ulp(float exact, float argument, int max_ulp);
inline float device_result(float exact, float argument, int max_ulp) {
    return device_math_perturbed() ? move_ulp(exact, argument, max_ulp) : exact;
}
inline float device_expf(float x) {
    if (std::fabs(x) < std::numeric_limits<float>::min()) return 1.0f;  // ±0 and ±subnormal: ex2 gives +1
    return device_result(std::exp(x), x, 2);
}
inline float device_logf(float x) { return device_result(std::log(x), x, 1); }
inline float device_erff(float x) {
    if (std::isinf(x)) return std::copysign(1.0f, x);
    const float e = device_result(std::erf(x), x, 2);
    return std::fabs(e) > 1.0f ? std::copysign(1.0f, e) : e;
}
inline float device_rsqrtf(float x) { return device_result(1.0f / std::sqrt(x), x, 2); }
}  // namespace cuda_sim
// Macros, not functions: the C library declares expf, logf and erff already. Each argument
// is evaluated once.
#define expf(x) ::cuda_sim::device_expf(static_cast<float>(x))
#define logf(x) ::cuda_sim::device_logf(static_cast<float>(x))
#define erff(x) ::cuda_sim::device_erff(static_cast<float>(x))

// CUDA's device math that the C++ library lacks, or names differently.
inline float rsqrtf(float x) { return ::cuda_sim::device_rsqrtf(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }

// ---------------------------------------------------------------------------------------
// The runtime API.

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorLaunchFailure = 719,
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

struct CUstream_st;
struct CUevent_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;
constexpr unsigned cudaStreamDefault = 0, cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDefault = 0, cudaEventDisableTiming = 2;

struct cudaDeviceProp {
    char name[256];
    std::size_t totalGlobalMem;
    std::size_t sharedMemPerBlock;
    std::size_t sharedMemPerBlockOptin;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int major, minor;
    int multiProcessorCount;
};

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t err);
const char* cudaGetErrorName(cudaError_t err);
cudaError_t cudaMemGetInfo(std::size_t* free, std::size_t* total);

cudaError_t cudaMalloc(void** ptr, std::size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocHost(void** ptr, std::size_t bytes);
cudaError_t cudaFreeHost(void* ptr);
// (file and line: where the call is, for the simulator's messages; callers pass neither.)
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                       const char* file = __builtin_FILE(), int line = __builtin_LINE());
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr, const char* file = __builtin_FILE(),
                            int line = __builtin_LINE());
cudaError_t cudaMemcpy2D(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                         std::size_t width, std::size_t height, cudaMemcpyKind kind);
cudaError_t cudaMemcpy2DAsync(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                              std::size_t width, std::size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* ptr, int value, std::size_t bytes, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE());
cudaError_t cudaMemsetAsync(void* ptr, int value, std::size_t bytes, cudaStream_t stream = nullptr,
                            const char* file = __builtin_FILE(), int line = __builtin_LINE());
template <class T>
cudaError_t cudaMalloc(T** ptr, std::size_t bytes) {
    return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
template <class T>
cudaError_t cudaMallocHost(T** ptr, std::size_t bytes) {
    return cudaMallocHost(reinterpret_cast<void**>(ptr), bytes);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
// The host time between the two records: the simulator's own time, never a GPU's.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

struct cudaFuncAttributes {
    std::size_t sharedSizeBytes;
    int maxThreadsPerBlock;
    int ptxVersion, binaryVersion;
};
namespace cuda_sim {
cudaError_t set_max_dynamic_shared(std::uintptr_t kernel, int bytes);
// The bytes of static __shared__ the kernel declares in its body (from the program's symbol
// table; those of the device functions it calls are not seen).
std::size_t static_shared_bytes(std::uintptr_t kernel);
// The most threads a block of the kernel may have: its __launch_bounds__ where nvcc compiled
// it (see kernel_resources below), else 1024.
int max_threads_per_block(std::uintptr_t kernel);
}
// Every kernel "has an image" for the simulator.
template <class Kernel>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, Kernel* kernel) {
    *attributes = cudaFuncAttributes{cuda_sim::static_shared_bytes(reinterpret_cast<std::uintptr_t>(kernel)),
                                     cuda_sim::max_threads_per_block(reinterpret_cast<std::uintptr_t>(kernel)), 90, 90};
    return cudaSuccess;
}
template <class Kernel>
cudaError_t cudaFuncSetAttribute(Kernel* kernel, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
    return cuda_sim::set_max_dynamic_shared(reinterpret_cast<std::uintptr_t>(kernel), value);
}

// ---------------------------------------------------------------------------------------
// Launches: ATTN_LAUNCH(kernel, grid, block, shared_bytes, stream)(arguments...).

namespace cuda_sim {

struct LaunchConfig {
    const char* name;
    std::uintptr_t kernel;
    dim3 grid, block;
    std::size_t shared_bytes;
    cudaStream_t stream;
    const char* file;  // where it was launched
    int line;
};

// Runs `body(arg)` as every thread of every block (the one non-template entry point): now,
// or, on a non-blocking stream, when the stream is synchronised (`keep` holds `arg` alive
// until then). `pointers` are the launch's pointer arguments: the device allocations they
// point into count as in use by the launch until it has run.
void launch(const LaunchConfig& config, void (*body)(void*), void* arg, std::shared_ptr<void> keep,
            std::vector<const void*> pointers);

// Work on `stream` that is not a kernel (cuBLAS's): `op` runs now on the legacy stream or a
// blocking stream, queued on a non-blocking one, as launch() does; `what` names it and
// `pointers` are the device memory it uses. Returns cudaErrorIllegalState, without running
// it, when it would race with work still queued on a non-blocking stream.
cudaError_t submit(cudaStream_t stream, const std::string& what, std::vector<const void*> pointers,
                   std::function<void()> op);

template <class T>
void add_pointer(std::vector<const void*>& out, const T& value) {
    if constexpr (std::is_pointer_v<T> && std::is_object_v<std::remove_pointer_t<T>>)
        out.push_back(static_cast<const void*>(value));
}

template <class F>
class Launcher {
public:
    Launcher(const LaunchConfig& config, F f) : config_(config), f_(f) {}
    template <class... A>
    void operator()(A... args) const {
        struct Call {
            F f;
            std::tuple<A...> args;
        };
        auto call = std::make_shared<Call>(Call{f_, std::tuple<A...>(args...)});
        std::vector<const void*> pointers;
        (add_pointer(pointers, args), ...);
        void* arg = call.get();
        launch(config_, [](void* p) {
            auto* c = static_cast<Call*>(p);
            std::apply(c->f, c->args);  // by value: each thread gets its own copies
        }, arg, std::move(call), std::move(pointers));
    }

private:
    LaunchConfig config_;
    F f_;
};

template <class Kernel, class F>
Launcher<F> make_launcher(const char* name, Kernel* kernel, F f, dim3 grid, dim3 block,
                          std::size_t shared_bytes, cudaStream_t stream,
                          const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return Launcher<F>({name, reinterpret_cast<std::uintptr_t>(kernel), grid, block, shared_bytes,
                        stream, file, line},
                       f);
}

// The simulator's settings and counters (tests and lessons read them).
struct Stats {
    std::size_t launches = 0, blocks = 0, threads = 0, switches = 0;
    std::size_t lost_update_checked = 0;  // race-checked launches also searched for lost updates
};
Stats& stats();
// Runs every launch twice in two thread orders and compares (also CUDA_SIM_RACECHECK=1).
void set_racecheck(bool on);
bool racecheck();
// Race-checks every launch rather than each kernel and shape's 1st, 2nd, 4th, 8th, … (for
// checks of the race check itself, which launch one kernel on many generated inputs).
void set_racecheck_every_launch(bool on);
// The tensor cores' fragment layouts (cuda_sim_wmma.hpp): which element of its 16×16 matrix
// each lane holds. CUDA leaves this unspecified and it differs between GPUs, so each run of
// a program draws one layout per fragment kind at random (CUDA_SIM_WMMA_SEED=N repeats a
// run's draw). A matrix_a or matrix_b fragment holds 16 elements a lane, every element of
// the matrix in two slots, as CUDA's 16-bit fragments of sm_70 and later do; an accumulator
// holds 8, every element once. The race check's second run uses a second draw, so a result
// that depends on the layout differs between its runs.
enum class FragmentKind { matrix_a = 0, matrix_b = 1, accumulator = 2 };
struct FragmentLayout {
    int elements = 0;                 // slots a lane holds
    unsigned char row[32][16] = {};   // slot (lane, element) → row of the matrix
    unsigned char col[32][16] = {};   // … and column
};
const FragmentLayout& fragment_layout(FragmentKind kind);
// The seed of this run's layouts.
std::uint64_t fragment_layout_seed();
// Work counted per launch, for a performance model (not a measurement of any GPU). With
// counting on (set_work_counting, or CUDA_SIM_COUNT_WORK=1), each kernel launch and cuBLAS
// call leaves a record: the device memory it read and wrote, found page by page (each page
// of the allocations its pointer arguments reach is made inaccessible before it runs, and
// the first access of each kind is recorded: read, or written), counted in bytes of the
// allocations those pages hold; and the floating-point operations the simulator itself
// carries out: cuBLAS's products (2·m·n·k, float32 or TF32) and the tensor cores'
// mma_sync (2·16·16·16 per warp). Arithmetic in a kernel's own code is plain C++ here and
// is not counted. A page read and written counts in both; memory read again after its
// first access (a cache's business on a GPU) counts once, so the bytes are what the launch
// must move at the least. Not counted (`counted` false): race-checked launches (their runs
// are compared byte by byte) and the sanitizer build (AddressSanitizer's allocations are
// not whole pages).
struct Work {
    std::string name;        // the kernel, or the cuBLAS call
    std::string site;        // file:line of the launch ("" for cuBLAS)
    dim3 grid, block;
    std::size_t shared_bytes = 0;  // per block: static and dynamic
    std::uintptr_t kernel = 0;     // the kernel's address (0 for cuBLAS)
    std::string symbol;            // its mangled name, from the program's symbol table
    std::size_t bytes_read = 0, bytes_written = 0;
    double fp32_flops = 0, tf32_flops = 0, f16_flops = 0;  // counted as above
    bool counted = false;
};
void set_work_counting(bool on);
bool work_counting();
// The records since the last call, in launch order.
std::vector<Work> take_work();
// Adds to the record of the launch or cuBLAS call running now (no-op when none is).
void note_flops(double fp32, double tf32, double f16);
// The device guard (also CUDA_SIM_GUARD_DEVICE=1): device memory is inaccessible to host
// code outside the simulator's own calls, as a GPU's memory is; host code that reads or
// writes through a device pointer ends the program with one line naming the access and the
// allocation. Not in the sanitizer build (AddressSanitizer's allocations are not whole
// pages): there it returns false and nothing is guarded.
bool set_device_guard(bool on);
bool device_guard();
// Whether [p, p + bytes) lies inside one device allocation; if not, why not.
bool in_device_memory(const void* p, std::size_t bytes, std::string* why);
// The last kernel failure in words ("" if none); clears the sticky error (for tests).
std::string take_failure();

// What nvcc compiled into a kernel for sm_90, where nvcc built the course
// (common/CMakeLists.txt writes build/cuda_resources/: ptxas's report and the cubin of each
// .cu file), read from the folder cuda_resources beside the program or one or two folders up.
struct KernelResources {
    bool known = false;        // nvcc compiled this kernel
    int registers = 0;         // per thread, by ptxas's report (0: not reported)
    unsigned max_threads = 0;  // its __launch_bounds__ (the cubin's maximum threads a block); 0: none
};
KernelResources kernel_resources(const std::string& mangled);
// Whether a cuda_resources folder was found (without one no kernel is known).
bool kernel_resources_found();

}  // namespace cuda_sim

// ---------------------------------------------------------------------------------------
// cuBLAS (on OpenBLAS, column-major as cuBLAS documents it).

struct cublasContext;
using cublasHandle_t = cublasContext*;
enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cublasMath_t {
    CUBLAS_DEFAULT_MATH = 0,
    CUBLAS_TENSOR_OP_MATH = 1,
    CUBLAS_PEDANTIC_MATH = 2,
    CUBLAS_TF32_TENSOR_OP_MATH = 3,
};

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
const char* cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float* alpha, const float* A, int lda,
                                         long long strideA, const float* B, int ldb,
                                         long long strideB, const float* beta, float* C, int ldc,
                                         long long strideC, int batchCount);
