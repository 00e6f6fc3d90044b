// Thread counts: OpenMP runs the library's loops and splits its matrix products, so
// OpenBLAS, called from inside those threads, runs each product on the calling thread.
#include "attn/threads.hpp"

#include <cblas.h>
#include <omp.h>
#include <sched.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

namespace attn {

namespace {

// Where each setting came from (empty until the policy or set_num_threads has run). A
// function-local static: the policy runs from another file's initializer, before this
// file's own namespace-scope objects would be constructed.
struct PolicyState {
    std::mutex mutex;
    std::string threads_from, blas_from;
};
PolicyState& state() {
    static PolicyState s;
    return s;
}

// A positive whole number from the environment, or 0 when unset or not one.
int positive_env(const char* name) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') return 0;
    char* end = nullptr;
    const long n = std::strtol(text, &end, 10);
    return *end == '\0' && n >= 1 && n <= 4096 ? static_cast<int>(n) : 0;
}

int usable_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
    return omp_get_num_procs();
}

}  // namespace
}  // namespace attn

// OpenBLAS (pthreads build) starts its pool of worker threads when it loads, before
// any of this program's code runs, and an idle pool thread spins for about 0.1 s before it
// sleeps: a second core busy for nothing at the start of every program. Where OpenBLAS
// exports its shutdown (0.3.21, Debian's, does; the declaration is weak, so a BLAS without
// it links too), the policy ends the pool when products run on the calling thread;
// OpenBLAS starts it again if more threads are asked for later.
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));

namespace attn {
namespace {

// OpenBLAS's pool: as OPENBLAS_NUM_THREADS says, else one thread (the caller's).
void apply_blas_side() {
    const int blas = positive_env("OPENBLAS_NUM_THREADS");
    openblas_set_num_threads(blas > 0 ? blas : 1);
    if (blas <= 1 && blas_thread_shutdown_ != nullptr) blas_thread_shutdown_();
    state().blas_from = blas > 0 ? "OPENBLAS_NUM_THREADS" : "default";
}

}  // namespace

void apply_thread_policy() {
    std::lock_guard<std::mutex> lock(state().mutex);
    apply_blas_side();
    if (state().threads_from.empty()) {
        // OpenMP's default already is OMP_NUM_THREADS, else the CPUs in the affinity mask.
        state().threads_from = positive_env("OMP_NUM_THREADS") > 0 ? "OMP_NUM_THREADS" : "CPUs";
    }
}

void set_num_threads(int n, const std::string& from) {
    if (n < 1) {
        throw std::invalid_argument("set_num_threads: expected at least 1 thread, got " +
                                    std::to_string(n));
    }
    std::lock_guard<std::mutex> lock(state().mutex);
    apply_blas_side();
    omp_set_num_threads(n);
    state().threads_from = from;
}

int num_threads() { return omp_get_max_threads(); }

ThreadConfig thread_config() {
    ThreadConfig c;
    c.threads = omp_get_max_threads();
    c.blas_threads = openblas_get_num_threads();
    c.cpus = usable_cpus();
    std::lock_guard<std::mutex> lock(state().mutex);
    c.threads_from = state().threads_from.empty() ? "not applied" : state().threads_from;
    c.blas_from = state().blas_from.empty() ? "not applied" : state().blas_from;
    return c;
}

std::string describe_threads() {
    const ThreadConfig c = thread_config();
    const auto plural = [](int n, const char* word) {
        return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
    };
    std::string line = "threads: " + std::to_string(c.threads) + " (";
    if (c.threads_from == "CPUs") {
        line += "the " + plural(c.cpus, "CPU") + " this process may use";
    } else if (c.threads_from == "OMP_NUM_THREADS") {
        line += "OMP_NUM_THREADS";
    } else {
        line += c.threads_from;
    }
    line += "); OpenBLAS " + plural(c.blas_threads, "thread") + " per product (" +
            (c.blas_from == "default" ? std::string("the library's default") : c.blas_from) + ")";
    if (c.threads * c.blas_threads > c.cpus) {
        line += "; warning: " + std::to_string(c.threads * c.blas_threads) +
                " threads at once on " + plural(c.cpus, "CPU") + " compete for them";
    }
    return line;
}

}  // namespace attn
