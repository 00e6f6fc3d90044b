// The catalogue of hardware mistakes (tests/cuda_sim/mistakes/): small kernels and host code
// that a real GPU would fail, hang on or race on, each of which the CUDA simulator must
// refuse. Every file holds one mistake:
//
//   // rule: <the rule of CUDA it breaks>
//   // refused: <text the simulator's refusal must contain>
//   #include "mistake.hpp"
//   MISTAKE(name) { ...; return said(cudaDeviceSynchronize()); }
//
// The body returns what the simulator said ("" when it let the mistake through). CMake reads
// the two header lines and adds the test "cudasim mistake <name>: <rule>" (label cudasim),
// which runs `cuda_sim_mistakes <name>` and passes when the mistake is refused with that text.
#pragma once

#include "cuda_sim.hpp"
#include "launch.cuh"

#include <map>
#include <string>

namespace mistakes {

using Body = std::string (*)();
std::map<std::string, Body>& registry();

struct Register {
    Register(const char* name, Body body) { registry()[name] = body; }
};

// What the simulator said of a CUDA call: "" for success, else CUDA's error text with the
// simulator's detail.
inline std::string said(cudaError_t e) { return e == cudaSuccess ? "" : cudaGetErrorString(e); }
inline std::string said(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? "" : cublasGetStatusString(s);
}

// What the simulator said of a mistake that ends the program (a host read or write it can
// only stop, with no CUDA call to return an error from): `body` runs in a child process, and
// the child's standard error is returned if it did not exit 0 ("" if it did).
std::string said_by_child(void (*body)());

// Ends a mistake this build cannot make (exit status 77, which CTest counts as skipped), with
// the reason in one line.
[[noreturn]] void skip(const char* why);

}  // namespace mistakes

#define MISTAKE(name)                                                   \
    static std::string mistake_##name();                               \
    static const ::mistakes::Register register_##name(#name, mistake_##name); \
    static std::string mistake_##name()
