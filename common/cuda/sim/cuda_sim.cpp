// The CUDA simulator's runtime: launches (blocks of fibers, barriers, shuffles, the launch
// checks a GPU makes), device memory, streams, events and the error state. See cuda_sim.hpp.
#include "cuda_sim.hpp"

#include <cxxabi.h>
#include <elf.h>
#include <signal.h>
#include <link.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define CUDA_SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDA_SIM_ASAN 1
#endif
#endif
#ifdef CUDA_SIM_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

thread_local uint3 threadIdx{0, 0, 0};
thread_local uint3 blockIdx{0, 0, 0};
thread_local dim3 blockDim;
thread_local dim3 gridDim;

// Work queued on a non-blocking stream: run when the stream is synchronised.
struct PendingWork {
    std::string what;                       // "kernel x", "cudaMemcpyAsync", ...
    std::vector<std::uintptr_t> allocations;  // the device allocations it uses
    std::function<void()> run;
    std::function<void()> release = {};  // called before it runs, or is dropped
};
struct CUstream_st {
    unsigned flags;
    std::deque<PendingWork> pending;
};
struct CUevent_st {
    unsigned flags;
    bool recorded = false;
    bool done = true;                // the stream has reached the record
    CUstream_st* stream = nullptr;   // where it was last recorded
    std::chrono::steady_clock::time_point when;
};

namespace cuda_sim {
namespace {

// ---------------------------------------------------------------------------------------
// Limits of a compute capability 9.0 GPU (H100), as cudaGetDeviceProperties reports them.
constexpr unsigned max_block_threads = 1024;
constexpr unsigned max_block_dim[3] = {1024, 1024, 64};
constexpr unsigned max_grid_dim[3] = {2147483647u, 65535, 65535};
constexpr std::size_t default_shared = 48 * 1024;
constexpr std::size_t optin_shared = 232448;  // 227 KiB
// The lost-update search compares, after every thread's segment, all the memory the launch
// can write: it runs where threads × those bytes stays under this many byte comparisons
// (about 0.1 s); larger launches get the two-order check only. In the course's simulated
// tests that is every attention kernel at its smaller shapes, and 11 of the 29 kernels of
// the GPT test (the others take the model's whole parameter or gradient buffer): the
// search costs those tests about a fifth more time, where searching every launch would
// make them two to five times slower.
constexpr std::size_t lost_update_budget = std::size_t{1} << 29;

constexpr std::size_t stack_bytes = 256 * 1024;  // each CUDA thread's stack (mostly untouched)

// ---------------------------------------------------------------------------------------
// One block at a time on each OS thread: its CUDA threads are fibers.

enum class State { ready, at_barrier, at_shuffle, done };

// Switching between fibers. On x86-64 six callee-saved registers and the stack pointer, a
// few instructions (glibc's swapcontext also saves the signal mask, a system call each
// way, which made it most of the simulator's time); elsewhere ucontext.
#if defined(__x86_64__)
#define CUDA_SIM_ASM_SWITCH 1
extern "C" void cuda_sim_switch(void** save_sp, void* new_sp);
asm(R"(
    .text
    .globl cuda_sim_switch
    .type cuda_sim_switch, @function
cuda_sim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cuda_sim_switch, .-cuda_sim_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
struct Context {
    void* sp = nullptr;
};
#else
using Context = ucontext_t;
#endif

// A cp.async copy issued and not yet waited for: its source bytes, read at the call, land
// in the destination when a cp.async.wait_group covers its group.
struct AsyncCopy {
    unsigned char* dst;
    std::size_t bytes;
    unsigned char data[16];
    long group;  // 0: not committed yet
};

struct Thread {
    Context context;
    char* stack = nullptr;  // above a guard page, stack_bytes long
    State state = State::ready;
    uint3 idx{0, 0, 0};
    int lane = 0, warp = 0;
    const char* file = nullptr;  // the barrier or shuffle it waits at
    int line = 0;
    std::vector<AsyncCopy> async;  // cp.async copies not waited for
    long groups = 0;               // cp.async groups committed
};

struct Warp {
    int size = 0, arrived = 0, generation = 0;
    const char* file = nullptr;
    int line = 0;
    const char* what = "the warp shuffle";  // the call the lanes wait at
    std::uint64_t slots[2][32] = {};
    void* args[32] = {};  // a collective's arguments, by lane
};

struct Runner {
    std::vector<Thread> threads;
    std::vector<Warp> warps;
    Context scheduler;
    int current = -1;
    int done = 0;
    int arrived = 0;  // at the block barrier
    const char* sync_file = nullptr;
    int sync_line = 0;
    void (*body)(void*) = nullptr;
    void* arg = nullptr;
    std::vector<unsigned char> dynamic_shared;
    std::string failure;  // set by a thread that breaks a rule; ends the block
    bool dirty_stacks = false;
    bool reverse = false;  // the order of this launch's rounds: threads from last to first
    std::size_t switches = 0;  // into fibers, during this launch (then added to the stats)
#ifdef CUDA_SIM_ASAN
    const void* main_bottom = nullptr;
    std::size_t main_size = 0;
    bool from_scheduler = false;  // whether the fiber being entered was resumed by it
    const void* entered_from_bottom = nullptr;  // the stack a new fiber was entered from
    std::size_t entered_from_size = 0;
#endif
    // The lost-update check (the race check's first run): the memory the launch can write,
    // as it was after the last thread's segment, and which thread last changed each byte.
    struct Writer {
        int thread = -1;  // in the block; -1: nobody yet (or an atomic)
        std::size_t block = 0;
        std::size_t epoch = 0;  // barriers the block had passed
    };
    struct Tracked {
        unsigned char* start = nullptr;
        std::size_t bytes = 0;
        bool shared = false;  // shared memory: one block's, refilled for the next
        std::vector<unsigned char> shadow;
        std::vector<Writer> writers;
        std::string name = {};  // of a static __shared__ variable; "" otherwise
    };
    bool track = false;
    std::vector<Tracked> tracked;
    std::size_t block_serial = 0, epoch = 0;
    std::vector<std::pair<std::uintptr_t, std::size_t>> atomics;  // this segment's atomic bytes
    // The tensor cores' fragment layouts in use: the run's first draw, or (the race check's
    // second run) its second; and whether the launch asked for one.
    int layout_set = 0;
    bool used_fragments = false;
    // The launched kernel's static __shared__ variables (filled with NaN bytes for each block,
    // as a GPU leaves shared memory uninitialised), in this OS thread's copy.
    struct Static {
        unsigned char* start;
        std::size_t bytes;
        std::string name;  // demangled: kernel(arguments)::variable
    };
    std::vector<Static> static_shared;
    // The race check compares shared memory too: a block's shared memory as the block ends is
    // the same in every order its threads may run in when every read of another thread's
    // write is ordered by a barrier, so the two runs must leave it alike, block by block. A
    // race whose result stays in shared memory (a warp's reduction read by lane 0 alone: the
    // other lanes' partial results) is seen there though the bytes it writes to device memory
    // agree. The first run records a digest of each region (the dynamic shared memory, then
    // each static variable) of each block; the second compares and keeps the first mismatch.
    enum class SharedEnds { off, record, compare };
    SharedEnds shared_ends = SharedEnds::off;
    std::vector<std::uint64_t> shared_digests;  // (block, region) → digest, block-major
    std::string shared_differs;                 // the first mismatch in words ("" if none)
    // Stacks of threads that a smaller block left over, kept for the next larger one:
    // launches alternate between block sizes, and mapping the stacks again each time
    // costs more than the kernels.
    std::vector<char*> spare_stacks;
    ~Runner() {
        for (Thread& t : threads) {
            if (t.stack) munmap(t.stack - page(), stack_bytes + page());
        }
        for (char* stack : spare_stacks) munmap(stack - page(), stack_bytes + page());
    }
    static std::size_t page() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }
};

Runner& runner() {
    thread_local Runner r;
    return r;
}

// Back on the scheduler's stack after a fiber ran.
void fiber_main();
void record_writes(Runner& r);

void switch_context(Context* from, Context* to) {
#ifdef CUDA_SIM_ASM_SWITCH
    cuda_sim_switch(&from->sp, to->sp);
#else
    swapcontext(from, to);
#endif
}

// A fresh context that starts fiber_main on `stack`.
void make_context(Context* c, char* stack) {
#ifdef CUDA_SIM_ASM_SWITCH
    // At fiber_main's first instruction rsp must be 8 mod 16, as after a call: the switch's
    // `ret` pops fiber_main's address from top − 16, above it a zero return address.
    auto top = reinterpret_cast<std::uintptr_t>(stack + stack_bytes) & ~std::uintptr_t{15};
    auto* slot = reinterpret_cast<void**>(top - 16);
    slot[1] = nullptr;
    slot[0] = reinterpret_cast<void*>(&fiber_main);
    for (int i = 1; i <= 6; ++i) slot[-i] = nullptr;  // rbp, rbx, r12..r15
    c->sp = slot - 6;
#else
    getcontext(c);
    c->uc_stack.ss_sp = stack;
    c->uc_stack.ss_size = stack_bytes;
    c->uc_link = nullptr;
    makecontext(c, fiber_main, 0);
#endif
}

// A round resumes every ready thread once, in index order (reversed in the race check's
// second run). The thread after i in the running round: the next ready one, or -1 when
// the round is over.
int next_in_round(const Runner& r, int i) {
    const int n = static_cast<int>(r.threads.size());
    const int step = r.reverse ? -1 : 1;
    for (int j = i + step; j >= 0 && j < n; j += step) {
        if (r.threads[static_cast<std::size_t>(j)].state == State::ready) return j;
    }
    return -1;
}

// Starts a round at thread i; returns when the round is over (or a thread broke a rule).
// The threads pass control to one another directly (see yield), not through here.
void resume(Runner& r, int i) {
    Thread& t = r.threads[static_cast<std::size_t>(i)];
    r.current = i;
    threadIdx = t.idx;
    ++r.switches;
#ifdef CUDA_SIM_ASAN
    void* fake = nullptr;
    r.from_scheduler = true;
    __sanitizer_start_switch_fiber(&fake, t.stack, stack_bytes);
    switch_context(&r.scheduler, &t.context);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    switch_context(&r.scheduler, &t.context);
#endif
    r.current = -1;
}

// From a fiber that waits or has finished to the next thread of the round, or to the
// scheduler at the round's end (one switch instead of two through the scheduler); returns
// when this thread is resumed.
void yield(Runner& r) {
    Thread& t = r.threads[static_cast<std::size_t>(r.current)];
    const int next = r.failure.empty() ? next_in_round(r, r.current) : -1;
    Context* to = &r.scheduler;
    if (next >= 0) {
        Thread& u = r.threads[static_cast<std::size_t>(next)];
        r.current = next;
        threadIdx = u.idx;
        ++r.switches;
        to = &u.context;
    }
#ifdef CUDA_SIM_ASAN
    void* fake = nullptr;
    r.from_scheduler = false;
    __sanitizer_start_switch_fiber(t.state == State::done ? nullptr : &fake,
                                   next >= 0 ? r.threads[static_cast<std::size_t>(next)].stack
                                             : r.main_bottom,
                                   next >= 0 ? stack_bytes : r.main_size);
    switch_context(&t.context, to);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    switch_context(&t.context, to);
#endif
}

// A rule is broken: the block stops here (its fibers are abandoned, never resumed).
// The thread's stack is abandoned, never unwound: a string alive on it would leak (and
// LeakSanitizer says so). So the message arrives by value and is moved out of this frame,
// and callers build it in a statement of its own (its temporaries gone) and move it in.
[[noreturn]] void fail(Runner& r, std::string what) {
    if (r.failure.empty()) r.failure = std::move(what);
    std::string().swap(what);  // empty either way
    r.threads[static_cast<std::size_t>(r.current)].state = State::done;
    r.dirty_stacks = true;
    yield(r);
    std::abort();  // never resumed
}

std::string name3(uint3 v);

void fiber_main() {
    Runner& r = runner();
#ifdef CUDA_SIM_ASAN
    // The stack this fiber was entered from: the scheduler's, to switch back to later,
    // unless another fiber passed control to it. (Into the runner, not into locals of this
    // frame, whose redzones would stay poisoned where the next block's fiber starts.)
    __sanitizer_finish_switch_fiber(nullptr, &r.entered_from_bottom, &r.entered_from_size);
    if (r.from_scheduler) {
        r.main_bottom = r.entered_from_bottom;
        r.main_size = r.entered_from_size;
    }
#endif
    r.body(r.arg);
    if (const std::size_t pending = r.threads[static_cast<std::size_t>(r.current)].async.size()) {
        std::string m = "thread " + name3(threadIdx) + " ended with " + std::to_string(pending) +
                        (pending == 1 ? " cp.async copy" : " cp.async copies") +
                        " it never waited for (cp.async.wait_group or wait_all): nothing "
                        "orders their arrival before another thread's read";
        fail(r, std::move(m));
    }
    record_writes(r);
    r.threads[static_cast<std::size_t>(r.current)].state = State::done;
    ++r.done;
    yield(r);
    std::abort();  // a finished thread is never resumed
}

std::string where(const char* file, int line) {
    std::string f = file ? file : "?";
    const auto slash = f.find_last_of('/');
    if (slash != std::string::npos) f = f.substr(slash + 1);
    return f + ":" + std::to_string(line);
}

std::string name3(uint3 v) {
    return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}

// Why no thread of the block can go on, in one sentence.
std::string deadlock(const Runner& r) {
    const int n = static_cast<int>(r.threads.size());
    if (r.arrived > 0) {
        return "__syncthreads at " + where(r.sync_file, r.sync_line) + " is reached by " +
               std::to_string(r.arrived) + " of the block's " + std::to_string(n) +
               " threads; " + std::to_string(r.done) +
               " returned without reaching it (on a GPU: a hang or wrong results)";
    }
    for (std::size_t w = 0; w < r.warps.size(); ++w) {
        const Warp& wp = r.warps[w];
        if (wp.arrived > 0) {
            return std::string(wp.what) + " at " + where(wp.file, wp.line) + " is reached by " +
                   std::to_string(wp.arrived) + " of warp " + std::to_string(w) + "'s " +
                   std::to_string(wp.size) + " lanes; the others returned";
        }
    }
    return "no thread can run";
}

// Runs one block; false (with r.failure set) when a thread broke a rule.
// The lost-update check: the bytes of the tracked memory that the thread now running changed
// since the last thread's segment ended (its writes since its last barrier, shuffle or
// start) are its writes. Two threads writing one byte with nothing to order them (in one
// block between two barriers, or in two blocks of a launch) is a race even when the result
// comes out right here: a GPU runs them at once and one write is lost. A byte written with
// the same value it held is no write here (a benign race). Atomics are told apart.
void record_writes(Runner& r) {
    if (!r.track || r.current < 0) return;
    const int me = r.current;
    for (Runner::Tracked& m : r.tracked) {
        // Most segments change nothing here, or a few bytes: pages that did not change are
        // passed over with one comparison each (in the sanitizer build every memcmp is
        // checked call by call, and 64-byte steps over all of memory after every segment
        // were most of a simulated kernel's time there).
        for (std::size_t page_at = 0; page_at < m.bytes; page_at += 4096) {
            const std::size_t page_end = std::min<std::size_t>(page_at + 4096, m.bytes);
            if (std::memcmp(m.start + page_at, m.shadow.data() + page_at, page_end - page_at) == 0) continue;
            for (std::size_t at = page_at; at < page_end; at += 64) {
                const std::size_t n = std::min<std::size_t>(64, page_end - at);
                if (std::memcmp(m.start + at, m.shadow.data() + at, n) == 0) continue;
                for (std::size_t b = at; b < at + n; ++b) {
                    if (m.start[b] == m.shadow[b]) continue;
                    m.shadow[b] = m.start[b];
                    const auto address = reinterpret_cast<std::uintptr_t>(m.start + b);
                    const bool atomic = std::any_of(r.atomics.begin(), r.atomics.end(), [&](const auto& a) {
                        return address >= a.first && address < a.first + a.second;
                    });
                    Runner::Writer& w = m.writers[b];
                    if (atomic) {
                        w = {};
                        continue;
                    }
                    const bool unordered = m.shared ? w.epoch == r.epoch : (w.block != r.block_serial || w.epoch == r.epoch);
                    if (w.thread >= 0 && (w.thread != me || w.block != r.block_serial) && unordered) {
                        const Thread& other = r.threads[static_cast<std::size_t>(w.thread)];
                        const Thread& self = r.threads[static_cast<std::size_t>(me)];
                        std::string what = "a lost update: threads " + name3(other.idx) + " and " + name3(self.idx) +
                                           (w.block != r.block_serial ? " of two blocks" : " of the block") +
                                           " both wrote byte " + std::to_string(b) + " of " +
                                           (!m.name.empty() ? m.name : m.shared ? "the dynamic shared memory" : "a device buffer of " + std::to_string(m.bytes) + " bytes") +
                                           (w.block != r.block_serial ? "" : " between two barriers") +
                                           " without an atomic (on a GPU they run at once, and one write is lost)";
                        fail(r, std::move(what));
                    }
                    w = {me, r.block_serial, r.epoch};
                }
            }
        }
    }
    r.atomics.clear();
}

// A digest of n bytes (a 64-bit multiply-xorshift over 8-byte words, then the tail): two
// different contents give the same digest with a chance near 2^-64.
std::uint64_t digest(const unsigned char* p, std::size_t n) {
    std::uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    const auto mix = [&h](std::uint64_t w) {
        h ^= w;
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 33;
    };
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        std::uint64_t w;
        std::memcpy(&w, p + i, 8);
        mix(w);
    }
    std::uint64_t tail = 0;
    if (n > i) std::memcpy(&tail, p + i, n - i);  // (p may be null where n is 0)
    mix(tail);
    return h;
}

// The race check's record (first run) or comparison (second) of the shared memory a block
// leaves behind (see Runner::shared_ends).
void shared_end_of_block(Runner& r, uint3 block) {
    if (r.shared_ends == Runner::SharedEnds::off) return;
    const std::size_t b = block.x + static_cast<std::size_t>(gridDim.x) * (block.y + static_cast<std::size_t>(gridDim.y) * block.z);
    const std::size_t regions = 1 + r.static_shared.size();
    const std::size_t blocks = static_cast<std::size_t>(gridDim.x) * gridDim.y * gridDim.z;
    if (r.shared_digests.size() != blocks * regions) r.shared_digests.assign(blocks * regions, 0);
    for (std::size_t k = 0; k < regions; ++k) {
        const std::uint64_t h = k == 0 ? digest(r.dynamic_shared.data(), r.dynamic_shared.size())
                                       : digest(r.static_shared[k - 1].start, r.static_shared[k - 1].bytes);
        std::uint64_t& kept = r.shared_digests[b * regions + k];
        if (r.shared_ends == Runner::SharedEnds::record) {
            kept = h;
        } else if (kept != h && r.shared_differs.empty()) {
            r.shared_differs = (k == 0 ? std::string("the dynamic shared memory")
                                       : "__shared__ " + r.static_shared[k - 1].name) +
                               " of block " + name3(block) + " ends with other bytes";
        }
    }
}

bool run_block(Runner& r, uint3 block, bool reverse) {
    blockIdx = block;
    const int n = static_cast<int>(r.threads.size());
#ifdef CUDA_SIM_ASAN
    if (r.dirty_stacks) {  // abandoned fibers leave poisoned frames behind
        for (Thread& t : r.threads) __asan_unpoison_memory_region(t.stack, stack_bytes);
    }
#endif
    r.dirty_stacks = false;
    for (int i = 0; i < n; ++i) {
        Thread& t = r.threads[static_cast<std::size_t>(i)];
        t.state = State::ready;
        t.async.clear();
        t.groups = 0;
        make_context(&t.context, t.stack);
    }
    for (Warp& w : r.warps) w.arrived = 0;
    r.arrived = 0;
    r.done = 0;
    std::fill(r.dynamic_shared.begin(), r.dynamic_shared.end(), 0xff);  // as uninitialised
    for (const Runner::Static& v : r.static_shared) std::memset(v.start, 0xff, v.bytes);
    r.reverse = reverse;
    if (r.track) {
        ++r.block_serial;
        r.epoch = 0;
        r.atomics.clear();
        for (Runner::Tracked& m : r.tracked) {
            if (!m.shared) continue;
            std::memcpy(m.shadow.data(), m.start, m.bytes);  // this block's own, fresh
            std::fill(m.writers.begin(), m.writers.end(), Runner::Writer{});
        }
    }
    for (;;) {
        const int first = next_in_round(r, reverse ? n : -1);
        const bool ran = first >= 0;
        if (ran) resume(r, first);  // the whole round: each thread hands over to the next
        if (!r.failure.empty()) return false;
        if (r.done == n) {
            shared_end_of_block(r, block);
            return true;
        }
        if (!ran) {
            r.failure = deadlock(r);
            r.dirty_stacks = true;
            return false;
        }
    }
}

// ---------------------------------------------------------------------------------------
// The device: memory, streams, events, the error state.

// Static __shared__ memory. `__shared__` is `static thread_local` here, which C++ gives no
// way to measure where it is declared; the program's symbol table does: a variable declared
// in function f is the thread-local symbol _ZZ<f's mangled name>E<its name>, with its size
// and its offset in the program's thread-local block. This finds, for a kernel, the
// variables declared in its body (not those of the device functions it calls).
struct StaticVariable {
    std::string name;  // mangled
    std::size_t offset = 0, bytes = 0;
};
struct StaticShared {
    bool known = false;  // the kernel was found in the symbol table
    std::size_t bytes = 0;
    std::vector<StaticVariable> variables;
};

class SymbolTable {
public:
    static const SymbolTable& get() {
        static const SymbolTable table;
        return table;
    }

    StaticShared of(std::uintptr_t kernel) const {
        StaticShared out;
        const auto f = functions_.find(kernel);
        if (f == functions_.end() || f->second.name.compare(0, 2, "_Z") != 0) return out;
        out.known = true;
        const std::string prefix = "_ZZ" + f->second.name.substr(2) + "E";
        for (const Tls& v : tls_) {
            if (v.name.compare(0, prefix.size(), prefix) != 0) continue;
            if (v.file >= 0 && f->second.file >= 0 && v.file != f->second.file) continue;  // another file's
            out.variables.push_back({v.name, v.offset, v.bytes});
            out.bytes += v.bytes;
        }
        return out;
    }

    // The function's (mangled) name, or "" where the symbol table lacks it.
    std::string symbol(std::uintptr_t function) const {
        const auto f = functions_.find(function);
        return f == functions_.end() ? "" : f->second.name;
    }

private:
    struct Function {
        std::string name;
        int file;  // the object file of a local symbol; -1 for a global one
    };
    struct Tls {
        std::string name;
        std::size_t offset, bytes;
        int file;
    };

    SymbolTable() {
        std::uintptr_t bias = 0;
        dl_iterate_phdr([](dl_phdr_info* info, std::size_t, void* out) {
            *static_cast<std::uintptr_t*>(out) = info->dlpi_addr;  // the program comes first
            return 1;
        }, &bias);
        std::ifstream in("/proc/self/exe", std::ios::binary);
        Elf64_Ehdr header{};
        if (!in.read(reinterpret_cast<char*>(&header), sizeof header) ||
            std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64) {
            return;
        }
        std::vector<Elf64_Shdr> sections(header.e_shnum);
        in.seekg(static_cast<std::streamoff>(header.e_shoff));
        if (!in.read(reinterpret_cast<char*>(sections.data()),
                     static_cast<std::streamsize>(sections.size() * sizeof(Elf64_Shdr)))) {
            return;
        }
        auto read = [&in](const Elf64_Shdr& section) {
            std::vector<char> bytes(section.sh_size);
            in.seekg(static_cast<std::streamoff>(section.sh_offset));
            in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
            if (!in) bytes.clear();
            return bytes;
        };
        for (const Elf64_Shdr& section : sections) {
            if (section.sh_type != SHT_SYMTAB || section.sh_link >= sections.size()) continue;
            const std::vector<char> symbols = read(section);
            const std::vector<char> names = read(sections[section.sh_link]);
            if (names.empty()) continue;
            int file = -1;
            for (std::size_t at = 0; at + sizeof(Elf64_Sym) <= symbols.size(); at += sizeof(Elf64_Sym)) {
                Elf64_Sym sym;
                std::memcpy(&sym, symbols.data() + at, sizeof sym);
                if (sym.st_name >= names.size()) continue;
                const int type = ELF64_ST_TYPE(sym.st_info);
                const bool local = ELF64_ST_BIND(sym.st_info) == STB_LOCAL;
                if (type == STT_FILE) {
                    ++file;
                    continue;
                }
                const char* name = names.data() + sym.st_name;
                if (type == STT_FUNC && sym.st_value != 0) {
                    functions_.emplace(bias + sym.st_value, Function{name, local ? file : -1});
                } else if (type == STT_TLS && std::strncmp(name, "_ZZ", 3) == 0) {
                    tls_.push_back({name, sym.st_value, sym.st_size, local ? file : -1});
                }
            }
        }
    }

    std::map<std::uintptr_t, Function> functions_;
    std::vector<Tls> tls_;
};

std::string demangle(const std::string& name) {
    int status = 0;
    char* d = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
    std::string out = status == 0 && d ? d : name;
    std::free(d);
    return out;
}

// A mangled name with every anonymous namespace's name made the same: g++ calls one
// "_GLOBAL__N_1", nvcc gives each file's its own ("_GLOBAL__N__c1b31aed_18_attention_flash_cu_…"),
// and g++'s mark of internal linkage dropped, so that a kernel's two names compare equal.
std::string comparable_symbol(const std::string& m) {
    std::string out;
    std::size_t i = 0;
    while (i < m.size()) {
        if (m[i] < '0' || m[i] > '9') {
            out += m[i++];
            continue;
        }
        std::size_t j = i;
        while (j < m.size() && m[j] >= '0' && m[j] <= '9') ++j;
        const std::size_t length = std::stoul(m.substr(i, j - i));
        if (m.compare(j, 11, "_GLOBAL__N_") == 0 && j + length <= m.size()) {
            out += "(anonymous)";
            i = j + length;
            // g++ marks a name of internal linkage with L (_GLOBAL__N_1L20flash_…); nvcc does not.
            if (i + 1 < m.size() && m[i] == 'L' && m[i + 1] >= '0' && m[i + 1] <= '9') ++i;
        } else {
            out.append(m, i, j - i);
            i = j;
        }
    }
    return out;
}

// What nvcc compiled into each kernel (cuda_sim::kernel_resources): ptxas's reports (*.txt)
// and the cubins (*.cubin) in build/cuda_resources. A cubin is an ELF file whose section
// ".nv.info.<kernel>" holds the kernel's attributes as records of a format byte, an attribute
// byte and, for the sized format (4), a 16-bit size and that many bytes. Attribute 5 is the
// most threads a block may have, three 32-bit numbers (x, y, z), written where the kernel
// has __launch_bounds__ (nvcc 13 for sm_90; a kernel without one has no such record).
class Resources {
public:
    static const Resources& get() {
        static const Resources r;
        return r;
    }
    bool found() const { return found_; }
    cuda_sim::KernelResources of(const std::string& mangled) const {
        const auto it = kernels_.find(comparable_symbol(mangled));
        return it == kernels_.end() ? cuda_sim::KernelResources{} : it->second;
    }

private:
    Resources() {
        std::error_code ec;
        const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
        if (ec) return;
        const std::filesystem::path up1 = exe.parent_path(), up2 = up1.parent_path(), up3 = up2.parent_path();
        for (const std::filesystem::path& dir : {up1, up2, up3}) {
            if (!std::filesystem::is_directory(dir / "cuda_resources", ec)) continue;
            found_ = true;
            for (const auto& entry : std::filesystem::directory_iterator(dir / "cuda_resources", ec)) {
                if (entry.path().extension() == ".txt") read_report(entry.path());
                if (entry.path().extension() == ".cubin") read_cubin(entry.path());
            }
            return;
        }
    }

    void read_report(const std::filesystem::path& path) {
        std::ifstream in(path);
        std::string line, kernel;
        while (std::getline(in, line)) {
            const auto at = line.find("Compiling entry function '");
            if (at != std::string::npos) {
                const auto start = at + 26, end = line.find('\'', start);
                kernel = end == std::string::npos ? "" : comparable_symbol(line.substr(start, end - start));
                continue;
            }
            const auto used = line.find("Used ");
            if (!kernel.empty() && used != std::string::npos && line.find(" registers") != std::string::npos) {
                cuda_sim::KernelResources& k = kernels_[kernel];
                k.known = true;
                k.registers = std::atoi(line.c_str() + used + 5);
                kernel.clear();
            }
        }
    }

    void read_cubin(const std::filesystem::path& path) {
        std::ifstream in(path, std::ios::binary);
        const std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        Elf64_Ehdr header{};
        if (file.size() < sizeof header) return;
        std::memcpy(&header, file.data(), sizeof header);
        if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64 ||
            header.e_shoff + std::size_t{header.e_shnum} * sizeof(Elf64_Shdr) > file.size() ||
            header.e_shstrndx >= header.e_shnum) {
            return;
        }
        std::vector<Elf64_Shdr> sections(header.e_shnum);
        std::memcpy(sections.data(), file.data() + header.e_shoff, sections.size() * sizeof(Elf64_Shdr));
        const Elf64_Shdr& names = sections[header.e_shstrndx];
        if (names.sh_offset + names.sh_size > file.size()) return;
        const std::string prefix = ".nv.info.";
        for (const Elf64_Shdr& section : sections) {
            if (section.sh_name >= names.sh_size || section.sh_offset + section.sh_size > file.size()) continue;
            const char* name = file.data() + names.sh_offset + section.sh_name;
            const std::size_t length = strnlen(name, names.sh_size - section.sh_name);
            if (length <= prefix.size() || std::string(name, prefix.size()) != prefix) continue;
            cuda_sim::KernelResources& k =
                kernels_[comparable_symbol(std::string(name + prefix.size(), length - prefix.size()))];
            k.known = true;
            const unsigned char* b = reinterpret_cast<const unsigned char*>(file.data() + section.sh_offset);
            for (std::size_t i = 0; i + 4 <= section.sh_size;) {
                const unsigned format = b[i], attribute = b[i + 1];
                if (format != 4) {  // a value in the record's last two bytes, or none
                    i += 4;
                    continue;
                }
                const std::size_t size = b[i + 2] | (std::size_t{b[i + 3]} << 8);
                if (attribute == 5 && size == 12 && i + 16 <= section.sh_size) {
                    std::uint32_t xyz[3];
                    std::memcpy(xyz, b + i + 4, sizeof xyz);
                    k.max_threads = xyz[0] * xyz[1] * xyz[2];
                }
                i += 4 + size;
            }
        }
    }

    bool found_ = false;
    std::map<std::string, cuda_sim::KernelResources> kernels_;
};

// This OS thread's copy of the program's thread-local block (where static __shared__ lives).
unsigned char* program_tls() {
    thread_local unsigned char* block = [] {
        void* out = nullptr;
        dl_iterate_phdr([](dl_phdr_info* info, std::size_t, void* o) {
            *static_cast<void**>(o) = info->dlpi_tls_data;
            return 1;
        }, &out);
        return static_cast<unsigned char*>(out);
    }();
    return block;
}

struct Device {
    std::recursive_mutex mutex;  // a synchronisation runs queued work, which takes it again
    std::map<std::uintptr_t, std::size_t> allocations;  // device memory: start → bytes
    std::map<std::uintptr_t, std::size_t> pinned;       // cudaMallocHost memory: start → bytes
    std::set<CUstream_st*> streams;
    std::set<CUevent_st*> events;
    std::map<std::uintptr_t, int> max_dynamic_shared;  // kernel → bytes allowed
    std::map<std::uintptr_t, StaticShared> static_shared;  // kernel → its static __shared__
    std::map<std::uintptr_t, unsigned> launch_bounds;     // kernel → its __launch_bounds__ (0: none)

    unsigned bound(std::uintptr_t kernel) {
        auto it = launch_bounds.find(kernel);
        if (it == launch_bounds.end()) {
            const std::string symbol = SymbolTable::get().symbol(kernel);
            it = launch_bounds.emplace(kernel, symbol.empty() ? 0u : Resources::get().of(symbol).max_threads).first;
        }
        return it->second;
    }

    const StaticShared& statics(std::uintptr_t kernel) {
        auto it = static_shared.find(kernel);
        if (it == static_shared.end()) it = static_shared.emplace(kernel, SymbolTable::get().of(kernel)).first;
        return it->second;
    }
    cudaError_t last = cudaSuccess;
    cudaError_t sticky = cudaSuccess;  // a kernel failed: every later call reports it
    std::string detail;                // the last error in the simulator's words
    bool racecheck = false;
    std::map<std::string, std::size_t> race_checked;  // launches per kernel and configuration
    bool racecheck_every_launch = false;
    Stats stats;
    bool count_work = false;  // see cuda_sim::Work
    std::vector<Work> work;
    bool guard_device = false;  // device memory closed to host code (set_device_guard)
    std::atomic<int> open_depth{0};  // simulator calls under way: they open what they touch

    Device() {
        const char* rc = std::getenv("CUDA_SIM_RACECHECK");
        racecheck = rc && *rc && std::string(rc) != "0";
        const char* cw = std::getenv("CUDA_SIM_COUNT_WORK");
        count_work = cw && *cw && std::string(cw) != "0";
#ifndef CUDA_SIM_ASAN
        const char* gd = std::getenv("CUDA_SIM_GUARD_DEVICE");
        guard_device = gd && *gd && std::string(gd) != "0";
#endif
    }
};

Device& device() {
    static Device d;
    return d;
}

// Opens (or closes) every device allocation to host code: see DeviceScope.
void set_device_access(Device& d, bool open);
// Closes what the simulator's calls opened since the outermost one began.
void close_opened(Device& d);

// A simulator call under way: holds the device's lock. With the device guard on
// (set_device_guard), device memory is inaccessible outside such calls; inside one, the
// first access to an allocation faults and opens it (see device_guard_fault) until the
// outermost call ends, so a call pays for the allocations it touches, not for all of them.
struct DeviceScope {
    Device& d;
    std::lock_guard<std::recursive_mutex> lock;
    explicit DeviceScope(Device& device_) : d(device_), lock(device_.mutex) {
        if (d.guard_device) ++d.open_depth;
    }
    ~DeviceScope() {
        if (d.guard_device && --d.open_depth == 0) close_opened(d);
    }
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;
};

cudaError_t error(cudaError_t err, const std::string& detail) {
    Device& d = device();
    d.last = err;
    d.detail = detail;
    return err;
}

}  // namespace

// The allocation that holds [p, p + bytes), or why none does.
bool in_device_memory(const void* p, std::size_t bytes, std::string* why) {
    const Device& d = device();
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = d.allocations.upper_bound(a);
    if (it == d.allocations.begin()) {
        *why = "is not device memory";
        return false;
    }
    --it;
    if (a >= it->first + it->second && !(it->second == 0 && a == it->first)) {
        *why = "is not device memory";
        return false;
    }
    if (a + bytes > it->first + it->second) {
        *why = "runs " + std::to_string(a + bytes - it->first - it->second) +
               " bytes past the end of its device allocation of " + std::to_string(it->second) +
               " bytes";
        return false;
    }
    return true;
}

namespace {

cudaError_t check_device_range(const char* call, const char* role, const void* p,
                               std::size_t bytes) {
    std::string why;
    if (bytes == 0 || in_device_memory(p, bytes, &why)) return cudaSuccess;
    return error(cudaErrorInvalidValue, std::string(call) + ": the " + role + " (" +
                                            std::to_string(bytes) + " bytes) " + why);
}

// The start of the device allocation that holds p, or 0.
std::uintptr_t allocation_of(const Device& d, const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = d.allocations.upper_bound(a);
    if (it == d.allocations.begin()) return 0;
    --it;
    return a < it->first + std::max<std::size_t>(it->second, 1) ? it->first : 0;
}

std::vector<std::uintptr_t> allocations_of(const Device& d, const std::vector<const void*>& pointers) {
    std::vector<std::uintptr_t> out;
    for (const void* p : pointers)
        if (const std::uintptr_t a = allocation_of(d, p)) out.push_back(a);
    return out;
}

// Whether [p, p + bytes) is cudaMallocHost memory (a copy to or from it can run later).
bool is_pinned(const Device& d, const void* p, std::size_t bytes) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = d.pinned.upper_bound(a);
    if (it == d.pinned.begin()) return false;
    --it;
    return a + bytes <= it->first + it->second;
}

// Whether a kernel may dereference p: it points into (or just past) a device allocation or
// cudaMallocHost memory, which a GPU reaches through unified addressing.
bool reachable_from_device(const Device& d, const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    for (const auto* table : {&d.allocations, &d.pinned}) {
        auto it = table->upper_bound(a);
        if (it == table->begin()) continue;
        --it;
        if (a <= it->first + it->second) return true;
    }
    return false;
}

bool queues(const CUstream_st* s) { return s && (s->flags & cudaStreamNonBlocking); }

std::size_t page_bytes() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }
// Device allocations outside the sanitizer build: whole pages of their own, the data placed
// at the end of them (at a 256-byte boundary, as cudaMalloc aligns) with an inaccessible
// page on either side, so that a kernel or host code running past either end faults at
// once (see overrun_fault), and work counting and the device guard can protect them.
constexpr std::size_t device_alignment = 256;
struct Pages {
    std::uintptr_t first = 0;  // the first of the allocation's own pages (not the guards)
    std::size_t length = 0;
};
[[maybe_unused]] Pages pages_of(std::uintptr_t start, std::size_t bytes) {  // not in the sanitizer build
    const std::uintptr_t page = page_bytes();
    const std::uintptr_t first = start / page * page;
    const std::uintptr_t last = (start + std::max<std::size_t>(bytes, 1) + page - 1) / page * page;
    return {first, static_cast<std::size_t>(last - first)};
}

// The kernel (or cuBLAS call) running now, for the overrun message: "" when host code runs.
char running_now[200] = "";
void set_running(const std::string& what) {
    std::snprintf(running_now, sizeof running_now, "%s", what.c_str());
}

bool install_segv_handler();

// Names the kernel or call running now for overrun_fault, until it ends.
struct Running {
    explicit Running(const std::string& what) {
        install_segv_handler();  // again, where a test framework replaced it
        set_running(what);
    }
    ~Running() { set_running(""); }
    Running(const Running&) = delete;
    Running& operator=(const Running&) = delete;
};


// The allocations the device guard opened inside the current simulator call (the fault
// handler adds to it, from any thread: OpenBLAS's for cuBLAS); past its size, all are
// closed at the end.
constexpr std::size_t max_opened = 4096;
std::uintptr_t opened[max_opened];
std::atomic<std::size_t> opened_count{0};

[[maybe_unused]] void set_device_access(Device& d, bool open) {
#ifndef CUDA_SIM_ASAN
    if (!open) install_segv_handler();  // again, where a test framework replaced it
    for (const auto& [start, bytes] : d.allocations) {
        const Pages p = pages_of(start, bytes);
        mprotect(reinterpret_cast<void*>(p.first), p.length, open ? PROT_READ | PROT_WRITE : PROT_NONE);
    }
#else
    (void)d;
    (void)open;
#endif
}

void close_opened(Device& d) {
#ifndef CUDA_SIM_ASAN
    const std::size_t n = opened_count.exchange(0);
    if (n > max_opened) {
        set_device_access(d, false);
        return;
    }
    install_segv_handler();  // again, where a test framework replaced it
    for (std::size_t i = 0; i < n; ++i) {
        const auto it = d.allocations.find(opened[i]);  // not one freed since
        if (it == d.allocations.end()) continue;
        const Pages p = pages_of(it->first, it->second);
        mprotect(reinterpret_cast<void*>(p.first), p.length, PROT_NONE);
    }
#else
    (void)d;
#endif
}

// Marks allocation `start` open until the outermost simulator call ends.
[[maybe_unused]] void note_opened(std::uintptr_t start) {
    const std::size_t i = opened_count.fetch_add(1);
    if (i < max_opened) opened[i] = start;
}
// The bytes mapped for cudaMallocHost(bytes): whole pages and one inaccessible page after.
std::size_t pinned_mapping(std::size_t bytes) {
    const std::size_t page = page_bytes();
    return (bytes + page - 1) / page * page + page;
}

// Pinned memory with a queued copy: its pages are inaccessible (a copy will write them) or
// read-only (a copy will read them) until the copy runs. A host access faults, and the
// handler, finding the address in a guard, prints the guard's sentence and ends the
// program: on a GPU the host would read what the copy has not written yet, or change what
// it has not read. A fault on the guarded pages outside the copy's bytes opens that page
// for good (the program's other data there); any other fault goes to the handler before.
struct PinnedGuard {
    std::atomic<bool> active{false};
    std::uintptr_t first_page = 0, end_page = 0, start = 0, end = 0;
    char sentence[320] = {};
};
constexpr int max_pinned_guards = 64;
PinnedGuard pinned_guards[max_pinned_guards];
struct sigaction segv_before;

// Work counting (cuda_sim::Work): the device allocations a counted launch reaches, each
// inaccessible while it runs; a page's first read makes it read-only and marks it read (1),
// its first write makes it writable and marks it written (2). Published to the handler
// through two atomics; the launch's own thread, and OpenBLAS's for cuBLAS, may fault.
struct CountedRegion {
    std::uintptr_t start = 0;           // the first of the allocation's pages
    std::size_t mapped = 0;             // and their bytes
    std::uintptr_t data = 0;            // the allocation itself
    std::size_t bytes = 0;
    std::vector<unsigned char> pages;   // per page: 1 read, 2 written
};
std::atomic<CountedRegion*> counted_regions{nullptr};
std::atomic<std::size_t> counted_region_count{0};
Work* current_work = nullptr;

// Whether the fault in `context` was a write (x86-64's page-fault error code has bit 1 set);
// false elsewhere.
bool fault_was_write(void* context) {
#if defined(__x86_64__)
    return (static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#else
    (void)context;
    return false;
#endif
}

bool count_fault(std::uintptr_t a, void* context) {
#if defined(__x86_64__)
    CountedRegion* regions = counted_regions.load();
    const std::size_t n = counted_region_count.load();
    for (std::size_t i = 0; regions && i < n; ++i) {
        CountedRegion& g = regions[i];
        if (a < g.start || a >= g.start + g.mapped) continue;
        const bool write = fault_was_write(context);
        const std::size_t page = (a - g.start) / page_bytes();
        __atomic_fetch_or(&g.pages[page], static_cast<unsigned char>(write ? 2 : 1), __ATOMIC_RELAXED);
        mprotect(reinterpret_cast<void*>(g.start + page * page_bytes()), page_bytes(),
                 write ? PROT_READ | PROT_WRITE : PROT_READ);
        return true;
    }
#else
    (void)a;
    (void)context;
#endif
    return false;
}

// Host code touching device memory while the device guard holds it closed: one line
// naming the access and the allocation, and the program ends (on a GPU the host cannot
// dereference a device pointer: the access would fault there too, or read another page).
bool device_guard_fault(std::uintptr_t a, void* context) {
    Device& d = device();
    if (!d.guard_device) return false;
    auto it = d.allocations.upper_bound(a);
    if (it == d.allocations.begin()) return false;
    --it;
#ifndef CUDA_SIM_ASAN
    const Pages p = pages_of(it->first, it->second);
    if (a < p.first || a >= p.first + p.length) return false;
    if (d.open_depth.load() > 0) {  // the simulator's own access: open the allocation
        mprotect(reinterpret_cast<void*>(p.first), p.length, PROT_READ | PROT_WRITE);
        note_opened(it->first);
        return true;
    }
#else
    if (a >= it->first + std::max<std::size_t>(it->second, 1)) return false;
#endif
    const bool wrote = fault_was_write(context);
    char sentence[320];
    std::snprintf(sentence, sizeof sentence,
                  "CUDA simulator: host code %s device memory, byte %zu of a cudaMalloc allocation of %zu bytes "
                  "(a GPU's memory is not the host's: copy it with cudaMemcpy, or use cudaMallocHost or "
                  "managed memory for data both sides touch)\n",
                  wrote ? "wrote" : "read", static_cast<std::size_t>(a - it->first), it->second);
    const ssize_t ignored = write(2, sentence, std::strlen(sentence));
    (void)ignored;
    _exit(70);
}

// An access in the inaccessible page after (or before) a device allocation: one line naming
// who (the kernel running, or host code), the access and the allocation; then the fault
// goes on to the handler before the simulator's (a test framework names the test that
// crashed), as a GPU's illegal address ends the program.
bool overrun_fault(std::uintptr_t a, void* context) {
#ifndef CUDA_SIM_ASAN
    const Device& d = device();
    const std::uintptr_t page = page_bytes();
    auto next = d.allocations.upper_bound(a);
    const char* where_ = nullptr;
    std::size_t bytes = 0, distance = 0;
    if (next != d.allocations.begin()) {
        const auto prev = std::prev(next);
        const Pages p = pages_of(prev->first, prev->second);
        if (a >= p.first + p.length && a < p.first + p.length + page) {
            where_ = "past the end of";
            bytes = prev->second;
            distance = a - (prev->first + prev->second);
        }
    }
    if (!where_ && next != d.allocations.end()) {
        const Pages p = pages_of(next->first, next->second);
        if (a < p.first && a + page >= p.first) {
            where_ = "before the start of";
            bytes = next->second;
            distance = next->first - a;
        }
    }
    if (!where_) return false;
    const bool wrote = fault_was_write(context);
    char sentence[400];
    std::snprintf(sentence, sizeof sentence,
                  "CUDA simulator: %s %s %s a cudaMalloc allocation of %zu bytes (%zu bytes %s it): on a "
                  "GPU an illegal address or another buffer's data\n",
                  running_now[0] ? running_now : "host code", wrote ? "wrote" : "read", where_, bytes, distance,
                  where_[0] == 'p' ? "past" : "before");
    const ssize_t ignored = write(2, sentence, std::strlen(sentence));
    (void)ignored;
    return true;
#else
    (void)a;
    (void)context;
    return false;
#endif
}

void on_segv(int signal, siginfo_t* info, void* context) {
    const auto a = reinterpret_cast<std::uintptr_t>(info->si_addr);
    if (count_fault(a, context)) return;
    if (overrun_fault(a, context)) {
        sigaction(SIGSEGV, &segv_before, nullptr);  // fault again, as before the simulator
        return;
    }
    if (device_guard_fault(a, context)) return;
    for (PinnedGuard& g : pinned_guards) {
        if (!g.active.load() || a < g.first_page || a >= g.end_page) continue;
        if (a >= g.start && a < g.end) {
            const ssize_t ignored = write(2, g.sentence, std::strlen(g.sentence));
            (void)ignored;
            _exit(70);
        }
        const std::uintptr_t page = a / page_bytes() * page_bytes();
        mprotect(reinterpret_cast<void*>(page), page_bytes(), PROT_READ | PROT_WRITE);
        return;
    }
    (void)signal;
    (void)context;
    sigaction(SIGSEGV, &segv_before, nullptr);  // not the simulator's: fault again, as before
}

// Each page's queued copies: into it (no access) and from it (read-only).
std::map<std::uintptr_t, std::pair<int, int>>& guarded_pages() {
    static std::map<std::uintptr_t, std::pair<int, int>> pages;
    return pages;
}

void protect_page(std::uintptr_t page) {
    const auto& [into, from] = guarded_pages()[page];
    mprotect(reinterpret_cast<void*>(page), page_bytes(),
             into > 0 ? PROT_NONE : from > 0 ? PROT_READ : PROT_READ | PROT_WRITE);
}

// Installs on_segv, again wherever another handler has replaced it since (a test
// framework sets and restores its own around each test), keeping that one as the next.
bool install_segv_handler() {
    struct sigaction now {};
    if (sigaction(SIGSEGV, nullptr, &now) != 0) return false;
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_segv) return true;
    struct sigaction action {};
    action.sa_sigaction = on_segv;
    action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;  // an alternate stack where one is set (AddressSanitizer)
    sigemptyset(&action.sa_mask);
    return sigaction(SIGSEGV, &action, &segv_before) == 0;
}

// Runs `run` as the counted work `w` on `allocations` (see CountedRegion), and keeps the
// record; without counting, just runs it.
void run_counted(Device& d, Work w, const std::vector<std::uintptr_t>& allocations,
                 const std::function<void()>& run) {
    if (!d.count_work) {
        run();
        return;
    }
#if !defined(CUDA_SIM_ASAN) && defined(__x86_64__)
    std::vector<CountedRegion> regions;
    for (std::uintptr_t a : allocations) {
        const std::size_t bytes = d.allocations.at(a);
        if (bytes == 0 || std::any_of(regions.begin(), regions.end(),
                                      [a](const CountedRegion& g) { return g.data == a; })) continue;
        CountedRegion g;
        const Pages p = pages_of(a, bytes);
        g.start = p.first;
        g.mapped = p.length;
        g.data = a;
        g.bytes = bytes;
        g.pages.assign(g.mapped / page_bytes(), 0);
        regions.push_back(std::move(g));
    }
    if (install_segv_handler() && current_work == nullptr) {
        current_work = &w;
        for (const CountedRegion& g : regions) mprotect(reinterpret_cast<void*>(g.start), g.mapped, PROT_NONE);
        counted_region_count.store(regions.size());
        counted_regions.store(regions.data());
        run();
        counted_regions.store(nullptr);
        counted_region_count.store(0);
        for (const CountedRegion& g : regions) {
            // Open again, or (under the device guard) closed: the next access opens it.
            mprotect(reinterpret_cast<void*>(g.start), g.mapped, d.guard_device ? PROT_NONE : PROT_READ | PROT_WRITE);
            for (std::size_t p = 0; p < g.pages.size(); ++p) {
                // The allocation's bytes on this page (the first may hold fewer).
                const std::uintptr_t from = std::max(g.start + p * page_bytes(), g.data),
                                     to = std::min(g.start + (p + 1) * page_bytes(), g.data + g.bytes);
                const std::size_t on_page = to > from ? to - from : 0;
                if (g.pages[p] & 1) w.bytes_read += on_page;
                if (g.pages[p] & 2) w.bytes_written += on_page;
            }
        }
        current_work = nullptr;
        w.counted = true;
        d.work.push_back(std::move(w));
        return;
    }
#endif
    (void)allocations;
    Work* outer = current_work;
    if (!outer) current_work = &w;
    run();
    current_work = outer;
    d.work.push_back(std::move(w));  // bytes not counted (flops are, where the call is not nested)
}

std::function<void()> guard_pinned(const void* host, std::size_t bytes, bool into_host, const std::string& what) {
    const bool installed = install_segv_handler();
    int slot = -1;
    for (int i = 0; i < max_pinned_guards && slot < 0; ++i) {
        if (!pinned_guards[i].active.load()) slot = i;
    }
    if (!installed || slot < 0 || bytes == 0) return {};  // more queued copies than guards: unguarded
    PinnedGuard& g = pinned_guards[slot];
    const std::size_t page = page_bytes();
    g.start = reinterpret_cast<std::uintptr_t>(host);
    g.end = g.start + bytes;
    g.first_page = g.start / page * page;
    g.end_page = (g.end + page - 1) / page * page;
    std::snprintf(g.sentence, sizeof g.sentence,
                  "CUDA simulator: host code %s pinned memory that %s, queued on a non-blocking "
                  "stream, has not %s yet (on a GPU the copy may still be running: synchronise "
                  "the stream, or an event recorded after the copy, first)\n",
                  into_host ? "touched" : "wrote", what.c_str(), into_host ? "written" : "read");
    g.active.store(true);
    for (std::uintptr_t p = g.first_page; p < g.end_page; p += page) {
        auto& counts = guarded_pages()[p];
        ++(into_host ? counts.first : counts.second);
        protect_page(p);
    }
    return [slot, into_host] {
        PinnedGuard& h = pinned_guards[slot];
        h.active.store(false);
        for (std::uintptr_t p = h.first_page; p < h.end_page; p += page_bytes()) {
            auto& counts = guarded_pages()[p];
            --(into_host ? counts.first : counts.second);
            protect_page(p);
            if (counts.first == 0 && counts.second == 0) guarded_pages().erase(p);
        }
    };
}

// Runs the work queued on s, in order. After a kernel fails, the rest is dropped, as a GPU
// fails every later call.
void flush(Device& d, CUstream_st* s) {
    while (!s->pending.empty()) {
        PendingWork w = std::move(s->pending.front());
        s->pending.pop_front();
        if (w.release) w.release();
        if (d.sticky == cudaSuccess) w.run();
    }
}

void flush_all(Device& d) {
    for (CUstream_st* s : d.streams) flush(d, s);
}

// Work about to run now on the legacy stream (or a blocking one), `what`, using these
// allocations: "" if no work queued on a non-blocking stream uses any of them, or the
// race in words. (The legacy stream waits for blocking streams, never for non-blocking
// ones, so on a GPU the two would run in either order.)
std::string race_with_queued(const Device& d, const std::string& what,
                             const std::vector<std::uintptr_t>& allocations) {
    for (const CUstream_st* s : d.streams)
        for (const PendingWork& w : s->pending)
            for (std::uintptr_t a : allocations)
                if (std::find(w.allocations.begin(), w.allocations.end(), a) != w.allocations.end())
                    return what + " uses the device allocation of " +
                           std::to_string(d.allocations.at(a)) + " bytes that " + w.what +
                           ", queued on a non-blocking stream, also uses: the legacy stream does "
                           "not wait for a non-blocking stream, so on a GPU the two may run in "
                           "either order (synchronise that stream first)";
    return "";
}

cudaError_t refuse_race(const std::string& race) {
    error(cudaErrorIllegalState, race);
    std::fprintf(stderr, "CUDA simulator: %s\n", race.c_str());
    return cudaErrorIllegalState;
}

#define SIM_STICKY()                                           \
    do {                                                        \
        if (device().sticky != cudaSuccess) return device().sticky; \
    } while (false)

std::vector<std::vector<unsigned char>> snapshot(const Device& d) {
    std::vector<std::vector<unsigned char>> out;
    out.reserve(d.allocations.size());
    for (const auto& [start, bytes] : d.allocations) {
        const auto* p = reinterpret_cast<const unsigned char*>(start);
        out.emplace_back(p, p + bytes);
    }
    return out;
}

void restore(const Device& d, const std::vector<std::vector<unsigned char>>& s) {
    std::size_t i = 0;
    for (const auto& [start, bytes] : d.allocations) {
        if (bytes) std::memcpy(reinterpret_cast<void*>(start), s[i].data(), bytes);
        ++i;
    }
}

// The first byte of device memory that differs from a snapshot, in words ("" if none).
std::string first_difference(const Device& d, const std::vector<std::vector<unsigned char>>& s) {
    std::size_t i = 0;
    for (const auto& [start, bytes] : d.allocations) {
        const auto* now = reinterpret_cast<const unsigned char*>(start);
        for (std::size_t b = 0; b < bytes; ++b) {
            if (now[b] != s[i][b]) {
                return "the device buffer of " + std::to_string(bytes) + " bytes differs at byte " +
                       std::to_string(b);
            }
        }
        ++i;
    }
    return "";
}

// The run's two draws of fragment layouts (see cuda_sim.hpp).
struct FragmentLayouts {
    std::uint64_t seed = 0;
    FragmentLayout sets[2][3];
};

FragmentLayouts draw_fragment_layouts() {
    FragmentLayouts out;
    const char* env = std::getenv("CUDA_SIM_WMMA_SEED");
    if (env && *env) {
        char* end = nullptr;
        out.seed = std::strtoull(env, &end, 10);
        if (*end != '\0') {
            std::fprintf(stderr, "CUDA simulator: CUDA_SIM_WMMA_SEED=%s is not a whole number\n", env);
            std::exit(2);
        }
    } else {
        std::random_device device_random;
        out.seed = (static_cast<std::uint64_t>(device_random()) << 32) ^ device_random();
    }
    std::mt19937_64 random(out.seed);
    for (auto& set : out.sets) {
        for (int kind = 0; kind < 3; ++kind) {
            FragmentLayout& l = set[kind];
            const int copies = kind == 2 ? 1 : 2;  // 16-bit fragments hold each element twice
            l.elements = 8 * copies;
            // cell[lane][e]: the element (16·row + column) in slot e of the lane; each copy
            // of the matrix spread over 8 slots of every lane, the second copy of an element
            // never in the lane of the first (two lanes hold it, as on a GPU).
            int cell[32][16];
            for (int c = 0; c < copies; ++c) {
                std::vector<int> cells(256);
                for (int i = 0; i < 256; ++i) cells[static_cast<std::size_t>(i)] = i;
                std::shuffle(cells.begin(), cells.end(), random);
                for (int i = 0; i < 256; ++i) cell[i / 8][8 * c + i % 8] = cells[static_cast<std::size_t>(i)];
            }
            if (copies == 2) {
                std::vector<int> lane_of(256);
                for (int i = 0; i < 256; ++i) lane_of[static_cast<std::size_t>(cell[i / 8][i % 8])] = i / 8;
                std::uniform_int_distribution<int> any_slot(0, 255);
                for (bool moved = true; moved;) {  // swap second copies out of their first's lane
                    moved = false;
                    for (int i = 0; i < 256; ++i) {
                        int& here = cell[i / 8][8 + i % 8];
                        if (lane_of[static_cast<std::size_t>(here)] != i / 8) continue;
                        const int j = any_slot(random);
                        std::swap(here, cell[j / 8][8 + j % 8]);
                        moved = true;
                    }
                }
            }
            for (int lane = 0; lane < 32; ++lane) {
                std::shuffle(&cell[lane][0], &cell[lane][0] + l.elements, random);  // slots in any order
                for (int e = 0; e < l.elements; ++e) {
                    l.row[lane][e] = static_cast<unsigned char>(cell[lane][e] / 16);
                    l.col[lane][e] = static_cast<unsigned char>(cell[lane][e] % 16);
                }
            }
        }
    }
    return out;
}

const FragmentLayouts& fragment_layouts() {
    static const FragmentLayouts layouts = draw_fragment_layouts();
    return layouts;
}

// Every block of a launch, in forward or reverse order; "" or the failure.
std::string run_grid(const LaunchConfig& c, bool reverse) {
    Runner& r = runner();
    const dim3 g = c.grid;
    const std::size_t blocks = static_cast<std::size_t>(g.x) * g.y * g.z;
    for (std::size_t k = 0; k < blocks; ++k) {
        const std::size_t b = reverse ? blocks - 1 - k : k;
        const uint3 idx{static_cast<unsigned>(b % g.x), static_cast<unsigned>(b / g.x % g.y),
                        static_cast<unsigned>(b / g.x / g.y)};
        if (!run_block(r, idx, reverse)) {
            return "block " + name3(idx) + ": " + r.failure;
        }
    }
    return "";
}

}  // namespace

Stats& stats() { return device().stats; }

namespace {
bool& perturbed_math() {
    static bool on = [] {
        const char* v = std::getenv("CUDA_SIM_DEVICE_MATH");
        if (!v || !*v || std::string(v) == "exact") return false;
        if (std::string(v) == "ulp") return true;
        std::fprintf(stderr, "CUDA simulator: CUDA_SIM_DEVICE_MATH=%s: use ulp or exact\n", v);
        std::exit(2);
    }();
    return on;
}
}  // namespace

bool device_math_perturbed() { return perturbed_math(); }
void set_device_math_perturbed(bool on) { perturbed_math() = on; }

// A zero, infinite or NaN result is one of the special values CUDA gives exactly (see the
// header: expf(−inf) = +0, logf(1) = +0, erff(±0) = ±0, rsqrtf(+inf) = +0, the infinities,
// NaN): kept. A moved result that would reach 0 or change sign keeps the exact value (expf
// and rsqrtf are positive, logf and erff keep the sign of theirs).
float move_ulp(float exact, float argument, int max_ulp) {
    if (exact == 0.0f || !std::isfinite(exact) || max_ulp <= 0) return exact;
    std::uint32_t bits = 0;
    std::memcpy(&bits, &argument, sizeof bits);
    std::uint64_t h = bits * 0x9e3779b97f4a7c15ull;  // a multiplicative hash of the argument
    h ^= h >> 29;
    const int steps = static_cast<int>(h % static_cast<std::uint64_t>(2 * max_ulp + 1)) - max_ulp;
    float out = exact;
    for (int i = 0; i < (steps < 0 ? -steps : steps); ++i) {
        out = std::nextafter(out, steps < 0 ? -INFINITY : INFINITY);
    }
    const bool same_side = out != 0.0f && std::signbit(out) == std::signbit(exact);
    return std::isfinite(out) && same_side ? out : exact;
}

const FragmentLayout& fragment_layout(FragmentKind kind) {
    Runner& r = runner();
    r.used_fragments = true;
    return fragment_layouts().sets[r.layout_set][static_cast<int>(kind)];
}

std::uint64_t fragment_layout_seed() { return fragment_layouts().seed; }
void set_racecheck(bool on) { device().racecheck = on; }
void set_racecheck_every_launch(bool on) { device().racecheck_every_launch = on; }
bool racecheck() { return device().racecheck; }

std::string take_failure() {
    Device& d = device();
    std::string out = d.sticky != cudaSuccess || d.last != cudaSuccess ? d.detail : "";
    d.sticky = d.last = cudaSuccess;
    d.detail.clear();
    return out;
}

bool set_device_guard(bool on) {
#ifdef CUDA_SIM_ASAN
    (void)on;
    return false;
#else
    Device& d = device();
    std::lock_guard<std::recursive_mutex> lock(d.mutex);
    if (on && !install_segv_handler()) return false;
    if (d.guard_device == on) return true;
    d.guard_device = on;
    set_device_access(d, !on);
    if (!on) opened_count.store(0);
    return true;
#endif
}
bool device_guard() { return device().guard_device; }

void set_work_counting(bool on) { device().count_work = on; }
bool work_counting() { return device().count_work; }
std::vector<Work> take_work() {
    Device& d = device();
    DeviceScope scope(d);
    flush_all(d);
    std::vector<Work> out;
    out.swap(d.work);
    return out;
}
void note_flops(double fp32, double tf32, double f16) {
    if (Work* w = current_work) {
        w->fp32_flops += fp32;
        w->tf32_flops += tf32;
        w->f16_flops += f16;
    }
}

void note_atomic(const void* address, std::size_t bytes) {
    Runner& r = runner();
    if (r.track && r.current >= 0) r.atomics.emplace_back(reinterpret_cast<std::uintptr_t>(address), bytes);
}

int lane_id() {
    Runner& r = runner();
    return r.current < 0 ? 0 : r.threads[static_cast<std::size_t>(r.current)].lane;
}

void* dynamic_shared_memory() { return runner().dynamic_shared.data(); }

void cp_async(void* dst, const void* src, std::size_t bytes, const char* file, int line) {
    Runner& r = runner();
    if (r.current < 0) {
        std::fprintf(stderr, "CUDA simulator: cp.async at %s called from host code\n", where(file, line).c_str());
        std::abort();
    }
    std::string why;
    const auto d = reinterpret_cast<std::uintptr_t>(dst), s = reinterpret_cast<std::uintptr_t>(src);
    std::string wrong;
    if (d % bytes != 0 || s % bytes != 0) {
        wrong = "the destination and the source must be aligned to the copy's " + std::to_string(bytes) + " bytes";
    } else if (!in_device_memory(src, bytes, &why)) {
        wrong = "the source " + why + " (cp.async.ca.shared.global copies from device memory)";
    } else if (in_device_memory(dst, 1, &why)) {
        wrong = "the destination is device memory (cp.async.ca.shared.global copies into shared memory)";
    }
    if (!wrong.empty()) {
        std::string m = "cp.async at " + where(file, line) + ": " + wrong;
        std::string().swap(wrong);
        std::string().swap(why);
        fail(r, std::move(m));
    }
    Thread& t = r.threads[static_cast<std::size_t>(r.current)];
    AsyncCopy c{static_cast<unsigned char*>(dst), bytes, {}, 0};
    std::memcpy(c.data, src, bytes);
    // Until its wait the destination holds garbage, other garbage in the race check's second
    // run: a read before the wait gives NaN bytes, and a result that differs between the runs.
    std::memset(dst, r.reverse ? 0xfe : 0xff, bytes);
    t.async.push_back(c);
}

void cp_async_commit_group() {
    Runner& r = runner();
    if (r.current < 0) return;
    Thread& t = r.threads[static_cast<std::size_t>(r.current)];
    ++t.groups;
    for (AsyncCopy& c : t.async) {
        if (c.group == 0) c.group = t.groups;
    }
}

void cp_async_wait_group(int newest_pending) {
    Runner& r = runner();
    if (r.current < 0) return;
    Thread& t = r.threads[static_cast<std::size_t>(r.current)];
    const long last_done = t.groups - newest_pending;  // groups up to this one are complete
    std::vector<AsyncCopy> still;
    for (const AsyncCopy& c : t.async) {
        if (c.group != 0 && c.group <= last_done) {
            std::memcpy(c.dst, c.data, c.bytes);
        } else {
            still.push_back(c);
        }
    }
    t.async.swap(still);
}

void syncthreads(const char* file, int line) {
    Runner& r = runner();
    if (r.current < 0) return;  // host code: nothing to wait for
    record_writes(r);
    Thread& t = r.threads[static_cast<std::size_t>(r.current)];
    if (r.arrived > 0 && (r.sync_file != file || r.sync_line != line)) {
        std::string m = "threads of one block wait at two different barriers, __syncthreads at " +
                        where(r.sync_file, r.sync_line) + " and at " + where(file, line) +
                        " (a barrier inside a branch that not all threads take)";
        fail(r, std::move(m));
    }
    r.sync_file = file;
    r.sync_line = line;
    t.state = State::at_barrier;
    if (++r.arrived == static_cast<int>(r.threads.size())) {
        for (Thread& u : r.threads) u.state = State::ready;
        r.arrived = 0;
        ++r.epoch;  // what each thread wrote before it is ordered before what follows
    }
    yield(r);
}

std::uint64_t shuffle(unsigned mask, std::uint64_t bits, int source, bool own, const char* file,
                      int line) {
    Runner& r = runner();
    if (r.current < 0) return bits;
    record_writes(r);
    Thread& t = r.threads[static_cast<std::size_t>(r.current)];
    Warp& w = r.warps[static_cast<std::size_t>(t.warp)];
    if (mask != 0xffffffffu || w.size != 32) {
        char m[16];
        std::snprintf(m, sizeof m, "0x%08x", mask);
        std::string message = "the warp shuffle at " + where(file, line) + " has mask " + m +
                              " in a warp of " + std::to_string(w.size) +
                              " threads: the course's kernels shuffle whole warps (a block size "
                              "that is a multiple of 32, mask 0xffffffff)";
        fail(r, std::move(message));
    }
    if (w.arrived > 0 && (w.file != file || w.line != line)) {
        std::string m = "lanes of one warp wait at two different shuffles, at " +
                        where(w.file, w.line) + " and at " + where(file, line);
        fail(r, std::move(m));
    }
    w.file = file;
    w.line = line;
    w.what = "the warp shuffle";
    const int g = w.generation & 1;
    w.slots[g][t.lane] = bits;
    t.state = State::at_shuffle;
    if (++w.arrived == w.size) {
        const std::size_t first = static_cast<std::size_t>(t.warp) * 32;
        for (std::size_t i = first; i < first + 32; ++i) r.threads[i].state = State::ready;
        w.arrived = 0;
        ++w.generation;
    }
    yield(r);
    return own ? bits : w.slots[g][source];
}

void warp_collective(const char* what, void* lane_arg, std::string (*op)(void* const*),
                     const char* file, int line) {
    Runner& r = runner();
    if (r.current < 0) {
        std::fprintf(stderr, "CUDA simulator: %s at %s called from host code\n", what,
                     where(file, line).c_str());
        std::abort();
    }
    record_writes(r);
    Thread& t = r.threads[static_cast<std::size_t>(r.current)];
    Warp& w = r.warps[static_cast<std::size_t>(t.warp)];
    if (w.size != 32) {
        std::string m = std::string(what) + " at " + where(file, line) + " in a warp of " +
                        std::to_string(w.size) +
                        " threads: it needs all 32 lanes (a block size that is a multiple of 32)";
        fail(r, std::move(m));
    }
    if (w.arrived > 0 && (w.file != file || w.line != line)) {
        std::string m = "lanes of one warp wait at two different warp-collective calls, " +
                        std::string(w.what) + " at " + where(w.file, w.line) + " and " + what +
                        " at " + where(file, line) + " (every lane must reach the same call)";
        fail(r, std::move(m));
    }
    w.file = file;
    w.line = line;
    w.what = what;
    w.args[t.lane] = lane_arg;
    t.state = State::at_shuffle;
    if (++w.arrived == w.size) {
        // Every lane is parked here, its arguments alive on its stack: do the warp's work.
        std::string wrong = op(w.args);
        if (!wrong.empty()) {
            std::string m = std::string(what) + " at " + where(file, line) + ": " + wrong;
            std::string().swap(wrong);
            fail(r, std::move(m));
        }
        const std::size_t first = static_cast<std::size_t>(t.warp) * 32;
        for (std::size_t i = first; i < first + 32; ++i) r.threads[i].state = State::ready;
        w.arrived = 0;
        ++w.generation;
    }
    yield(r);
}

cudaError_t set_max_dynamic_shared(std::uintptr_t kernel, int bytes) {
    Device& d = device();
    DeviceScope scope(d);
    SIM_STICKY();
    if (bytes < 0 || static_cast<std::size_t>(bytes) > optin_shared) {
        return error(cudaErrorInvalidValue,
                     "cudaFuncSetAttribute: " + std::to_string(bytes) +
                         " bytes of dynamic shared memory, the device allows at most " +
                         std::to_string(optin_shared));
    }
    const std::size_t statics = d.statics(kernel).bytes;
    if (statics + static_cast<std::size_t>(bytes) > optin_shared) {
        return error(cudaErrorInvalidValue,
                     "cudaFuncSetAttribute: " + std::to_string(bytes) + " bytes of dynamic shared memory and the kernel's " +
                         std::to_string(statics) + " bytes of static __shared__ are over the " +
                         std::to_string(optin_shared) + " a block may have");
    }
    d.max_dynamic_shared[kernel] = bytes;
    return cudaSuccess;
}

std::size_t static_shared_bytes(std::uintptr_t kernel) {
    Device& d = device();
    DeviceScope scope(d);
    return d.statics(kernel).bytes;
}

int max_threads_per_block(std::uintptr_t kernel) {
    Device& d = device();
    DeviceScope scope(d);
    const unsigned bound = d.bound(kernel);
    return bound == 0 ? static_cast<int>(max_block_threads) : static_cast<int>(bound);
}

KernelResources kernel_resources(const std::string& mangled) { return Resources::get().of(mangled); }

bool kernel_resources_found() { return Resources::get().found(); }

namespace {
void execute(const LaunchConfig& c, void (*body)(void*), void* arg, const std::vector<std::uintptr_t>& allocations);
}  // namespace

void launch(const LaunchConfig& c, void (*body)(void*), void* arg, std::shared_ptr<void> keep,
            std::vector<const void*> pointers) {
    Device& d = device();
    DeviceScope scope(d);
    const std::string kernel = std::string(c.name) + " (launched at " + where(c.file, c.line) + ")";
    if (d.sticky != cudaSuccess) {
        d.last = d.sticky;
        return;
    }
    const unsigned bd[3] = {c.block.x, c.block.y, c.block.z};
    const unsigned gd[3] = {c.grid.x, c.grid.y, c.grid.z};
    const std::size_t threads = static_cast<std::size_t>(bd[0]) * bd[1] * bd[2];
    for (int i = 0; i < 3; ++i) {
        if (bd[i] == 0 || bd[i] > max_block_dim[i] || gd[i] == 0 || gd[i] > max_grid_dim[i]) {
            error(cudaErrorInvalidConfiguration,
                  kernel + ": grid (" + std::to_string(gd[0]) + "," + std::to_string(gd[1]) + "," +
                      std::to_string(gd[2]) + ") of blocks (" + std::to_string(bd[0]) + "," +
                      std::to_string(bd[1]) + "," + std::to_string(bd[2]) +
                      "): each dimension must be at least 1, blocks at most (1024,1024,64), "
                      "grids at most (2^31-1,65535,65535)");
            return;
        }
    }
    if (threads > max_block_threads) {
        error(cudaErrorInvalidConfiguration, kernel + ": " + std::to_string(threads) +
                                                 " threads per block, the limit is 1024");
        return;
    }
    // nvcc compiles __launch_bounds__(N) into the kernel, and a GPU refuses a launch of more
    // than N threads a block with cudaErrorInvalidValue (measured on an H200, CUDA 13).
    if (const unsigned bound = d.bound(c.kernel); bound != 0 && threads > bound) {
        error(cudaErrorInvalidValue, kernel + ": " + std::to_string(threads) +
                                         " threads per block, over the kernel's __launch_bounds__ of " +
                                         std::to_string(bound) + " (compiled into it by nvcc)");
        return;
    }
    const auto allowed_it = d.max_dynamic_shared.find(c.kernel);
    const std::size_t allowed = allowed_it == d.max_dynamic_shared.end()
                                    ? default_shared
                                    : static_cast<std::size_t>(allowed_it->second);
    if (c.shared_bytes > allowed) {
        error(cudaErrorInvalidValue,
              kernel + ": " + std::to_string(c.shared_bytes) +
                  " bytes of dynamic shared memory, the kernel may use " +
                  std::to_string(allowed) +
                  (allowed_it == d.max_dynamic_shared.end()
                       ? " (above 48 KiB a kernel needs cudaFuncSetAttribute("
                         "cudaFuncAttributeMaxDynamicSharedMemorySize))"
                       : ""));
        return;
    }
    // Static __shared__ counts against the same 48 KiB (ptxas refuses a kernel that declares
    // more), and with dynamic shared memory against 48 KiB unless the kernel opted in.
    const std::size_t statics = d.statics(c.kernel).bytes;
    if (statics > default_shared) {
        error(cudaErrorInvalidValue, kernel + ": " + std::to_string(statics) +
                                         " bytes of static __shared__ memory, over the 48 KiB a kernel may "
                                         "declare (ptxas refuses it; above 48 KiB shared memory must be "
                                         "dynamic, with cudaFuncSetAttribute)");
        return;
    }
    if (allowed_it == d.max_dynamic_shared.end() && statics + c.shared_bytes > default_shared) {
        error(cudaErrorInvalidValue,
              kernel + ": " + std::to_string(statics) + " bytes of static __shared__ memory and " +
                  std::to_string(c.shared_bytes) +
                  " of dynamic are over the 48 KiB a block may have without "
                  "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize)");
        return;
    }
    if (c.stream && !d.streams.count(c.stream)) {
        error(cudaErrorInvalidResourceHandle, kernel + ": launched on a destroyed stream");
        return;
    }
    // One address space here, two on a GPU: a pointer argument into ordinary host memory (a
    // std::vector's data(), a stack array) faults there on its first use.
    for (std::size_t i = 0; i < pointers.size(); ++i) {
        if (pointers[i] && !reachable_from_device(d, pointers[i])) {
            char address[32];
            std::snprintf(address, sizeof address, "%p", pointers[i]);
            error(cudaErrorInvalidValue,
                  kernel + ": pointer argument " + std::to_string(i + 1) + " (" + address +
                      ") is host memory, which a kernel cannot read or write (an illegal address "
                      "on a GPU): pass memory from cudaMalloc (or cudaMallocHost)");
            return;
        }
    }
    std::vector<std::uintptr_t> allocations = allocations_of(d, pointers);
    if (queues(c.stream)) {
        c.stream->pending.push_back({"kernel " + kernel, allocations,
                                     [c, body, arg, keep, allocations] { execute(c, body, arg, allocations); }});
        return;
    }
    const std::string race = race_with_queued(d, "kernel " + kernel, allocations);
    if (!race.empty()) {
        refuse_race(race);
        return;
    }
    execute(c, body, arg, allocations);
}

cudaError_t submit(cudaStream_t stream, const std::string& what, std::vector<const void*> pointers,
                   std::function<void()> op) {
    Device& d = device();
    DeviceScope scope(d);
    std::vector<std::uintptr_t> allocations = allocations_of(d, pointers);
    std::function<void()> counted = [what, allocations, op] {
        const Running running(what);
        Work w;
        w.name = what;
        run_counted(device(), std::move(w), allocations, op);
    };
    if (queues(stream)) {
        stream->pending.push_back({what, std::move(allocations), std::move(counted)});
        return cudaSuccess;
    }
    const std::string race = race_with_queued(d, what, allocations);
    if (!race.empty()) return refuse_race(race);
    counted();
    return cudaSuccess;
}

namespace {
Work work_of(const LaunchConfig& c) {
    Work w;
    w.name = c.name;
    w.site = where(c.file, c.line);
    w.grid = c.grid;
    w.block = c.block;
    w.kernel = c.kernel;
    w.symbol = SymbolTable::get().symbol(c.kernel);
    w.shared_bytes = c.shared_bytes + device().statics(c.kernel).bytes;
    return w;
}

// A launch that passed launch()'s checks, run now.
void execute(const LaunchConfig& c, void (*body)(void*), void* arg, const std::vector<std::uintptr_t>& allocations) {
    Device& d = device();
    const std::string kernel = std::string(c.name) + " (launched at " + where(c.file, c.line) + ")";
    const Running running(kernel);
    const unsigned bd[3] = {c.block.x, c.block.y, c.block.z};
    const unsigned gd[3] = {c.grid.x, c.grid.y, c.grid.z};
    const std::size_t threads = static_cast<std::size_t>(bd[0]) * bd[1] * bd[2];
    if (d.sticky != cudaSuccess) return;

    Runner& r = runner();
    if (r.threads.size() != threads) {
        const std::size_t page = Runner::page();
        for (std::size_t i = r.threads.size(); i < threads; ++i) {
            Thread t;
            if (!r.spare_stacks.empty()) {
                t.stack = r.spare_stacks.back();
                r.spare_stacks.pop_back();
#ifdef CUDA_SIM_ASAN
                __asan_unpoison_memory_region(t.stack, stack_bytes);  // an abandoned fiber's
#endif
            } else {
                void* m = mmap(nullptr, stack_bytes + page, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
                if (m == MAP_FAILED) {
                    error(cudaErrorMemoryAllocation, kernel + ": no memory for the threads' stacks");
                    return;
                }
                mprotect(m, page, PROT_NONE);  // a stack overflow faults instead of corrupting
                t.stack = static_cast<char*>(m) + page;
            }
            r.threads.push_back(t);
        }
        while (r.threads.size() > threads) {
            r.spare_stacks.push_back(r.threads.back().stack);
            r.threads.pop_back();
        }
    }
    for (std::size_t i = 0; i < threads; ++i) {
        Thread& t = r.threads[i];
        t.idx = {static_cast<unsigned>(i % bd[0]), static_cast<unsigned>(i / bd[0] % bd[1]),
                 static_cast<unsigned>(i / bd[0] / bd[1])};
        t.lane = static_cast<int>(i % 32);
        t.warp = static_cast<int>(i / 32);
    }
    r.warps.assign((threads + 31) / 32, Warp{});
    for (std::size_t w = 0; w < r.warps.size(); ++w) {
        r.warps[w].size = static_cast<int>(std::min<std::size_t>(32, threads - w * 32));
    }
    r.dynamic_shared.assign(c.shared_bytes, 0xff);
    r.static_shared.clear();
    if (unsigned char* tls = program_tls()) {
        for (const StaticVariable& v : d.statics(c.kernel).variables) {
            if (v.bytes > 0) r.static_shared.push_back({tls + v.offset, v.bytes, demangle(v.name)});
        }
    }
    r.body = body;
    r.arg = arg;
    r.failure.clear();
    blockDim = c.block;
    gridDim = c.grid;
    ++d.stats.launches;
    d.stats.blocks += static_cast<std::size_t>(gd[0]) * gd[1] * gd[2];
    d.stats.threads += threads * gd[0] * gd[1] * gd[2];

    std::string failure;
    // Each kernel is race-checked at each configuration (grid, block, shared memory) at its
    // 1st, 2nd, 4th, 8th, … launch: the check copies all of device memory twice, and a race
    // that needs data seen only later (a training step's second hundred) still gets its turns.
    const std::string shape = kernel + " " + name3({gd[0], gd[1], gd[2]}) + " " +
                              name3({bd[0], bd[1], bd[2]}) + " " + std::to_string(c.shared_bytes);
    const std::size_t nth = d.racecheck ? ++d.race_checked[shape] : 0;
    if (d.racecheck && (d.racecheck_every_launch || (nth & (nth - 1)) == 0)) {  // a power of two
        const auto before = snapshot(d);
        // The first run also looks for lost updates, in the memory the launch's pointers
        // reach and its dynamic shared memory, where that costs a bounded number of byte
        // comparisons (each thread's segment compares all of it once).
        std::size_t reach = r.dynamic_shared.size();
        for (const Runner::Static& v : r.static_shared) reach += v.bytes;
        for (std::uintptr_t a : allocations) reach += d.allocations.at(a);
        const std::size_t all_threads = threads * gd[0] * gd[1] * gd[2];
        r.track = reach > 0 && all_threads * reach <= lost_update_budget;
        if (r.track) {
            r.tracked.clear();
            for (std::uintptr_t a : allocations) {
                if (std::any_of(r.tracked.begin(), r.tracked.end(), [a](const Runner::Tracked& m) {
                        return reinterpret_cast<std::uintptr_t>(m.start) == a;
                    })) continue;  // two arguments into one allocation
                auto* start = reinterpret_cast<unsigned char*>(a);
                const std::size_t n = d.allocations.at(a);
                r.tracked.push_back({start, n, false, std::vector<unsigned char>(start, start + n),
                                     std::vector<Runner::Writer>(n)});
            }
            if (!r.dynamic_shared.empty()) {
                r.tracked.push_back({r.dynamic_shared.data(), r.dynamic_shared.size(), true,
                                     std::vector<unsigned char>(r.dynamic_shared.size()),
                                     std::vector<Runner::Writer>(r.dynamic_shared.size())});
            }
            for (const Runner::Static& v : r.static_shared) {
                r.tracked.push_back({v.start, v.bytes, true, std::vector<unsigned char>(v.bytes),
                                     std::vector<Runner::Writer>(v.bytes), "__shared__ " + v.name});
            }
            r.block_serial = 0;
            ++d.stats.lost_update_checked;
        }
        r.used_fragments = false;
        r.shared_ends = Runner::SharedEnds::record;
        r.shared_digests.clear();
        failure = run_grid(c, false);
        r.track = false;
        r.tracked.clear();
        if (failure.empty()) {
            const auto forward = snapshot(d);
            restore(d, before);
            r.layout_set = 1;  // a second draw of the tensor cores' fragment layouts
            r.shared_ends = Runner::SharedEnds::compare;
            r.shared_differs.clear();
            failure = run_grid(c, true);
            // Device memory first; then the shared memory the blocks left behind.
            const auto difference = [&] {
                std::string in_device = first_difference(d, forward);
                return in_device.empty() ? r.shared_differs : in_device;
            };
            std::string differs = failure.empty() ? difference() : "";
            if (!differs.empty() && r.used_fragments) {
                // Two things changed between the runs: the order and the fragment layouts.
                // The forward order with the second layouts tells them apart.
                restore(d, before);
                r.shared_differs.clear();
                const std::string again = run_grid(c, false);
                const std::string by_layout = again.empty() ? difference() : "";
                if (!by_layout.empty()) {
                    failure = "the result depends on which lane holds which element of a WMMA "
                              "fragment: " + by_layout + " between two runs with the fragment "
                              "layouts drawn twice (CUDA leaves the layout unspecified and it "
                              "differs between GPUs: code may apply one operation to every "
                              "element, not pick elements by position; CUDA_SIM_WMMA_SEED=" +
                              std::to_string(fragment_layout_seed()) + " repeats the draw)";
                    differs.clear();
                }
            }
            if (!differs.empty()) {
                failure = "a race: " + differs +
                          " between two runs with the threads and blocks in forward "
                          "and in reverse order (threads that touch the same memory "
                          "without a barrier between them, __syncthreads or, among a "
                          "warp's lanes, __syncwarp; a cp.async copy read before the "
                          "wait that covers it; or atomics whose order changes the "
                          "result)";
            }
            r.layout_set = 0;
        }
        r.shared_ends = Runner::SharedEnds::off;
        r.shared_digests.clear();
        if (d.count_work) {
            d.work.push_back(work_of(c));  // not counted: the runs are compared instead
        }
    } else {
        run_counted(d, work_of(c), allocations, [&] { failure = run_grid(c, false); });
    }
    threadIdx = {0, 0, 0};
    blockIdx = {0, 0, 0};
    d.stats.switches += r.switches;
    r.switches = 0;
    if (!failure.empty()) {
        d.sticky = error(cudaErrorLaunchFailure, kernel + ": " + failure);
        std::fprintf(stderr, "CUDA simulator: %s\n", d.detail.c_str());
    }
}
}  // namespace

}  // namespace cuda_sim

using cuda_sim::check_device_range;
using cuda_sim::DeviceScope;
using cuda_sim::device;
using cuda_sim::error;
using cuda_sim::flush;
using cuda_sim::flush_all;
using cuda_sim::queues;

// ---------------------------------------------------------------------------------------
// The runtime API.

cudaError_t cudaGetDeviceCount(int* count) {
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    return d == 0 ? cudaSuccess : error(cudaErrorInvalidValue, "cudaSetDevice: one device, 0");
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    if (d != 0) return error(cudaErrorInvalidValue, "cudaGetDeviceProperties: one device, 0");
    *p = cudaDeviceProp{};
    std::snprintf(p->name, sizeof p->name, "CUDA simulator on the CPU");
    p->totalGlobalMem = static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) *
                        static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    p->sharedMemPerBlock = cuda_sim::default_shared;
    p->sharedMemPerBlockOptin = cuda_sim::optin_shared;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int d) {
    if (d != 0) return error(cudaErrorInvalidValue, "cudaDeviceGetAttribute: one device, 0");
    switch (attr) {
        case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; break;
        case cudaDevAttrMultiProcessorCount: *value = 1; break;
        case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
        case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin:
            *value = static_cast<int>(cuda_sim::optin_shared);
            break;
        default: return error(cudaErrorInvalidValue, "cudaDeviceGetAttribute: not simulated");
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
    auto& d = device();
    DeviceScope scope(d);
    flush_all(d);
    return d.sticky;
}

cudaError_t cudaGetLastError() {
    auto& d = device();
    const cudaError_t e = d.sticky != cudaSuccess ? d.sticky : d.last;
    d.last = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() {
    auto& d = device();
    return d.sticky != cudaSuccess ? d.sticky : d.last;
}

const char* cudaGetErrorName(cudaError_t err) {
    switch (err) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
        case cudaErrorNoDevice: return "cudaErrorNoDevice";
        case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
        case cudaErrorIllegalState: return "cudaErrorIllegalState";
        case cudaErrorNotReady: return "cudaErrorNotReady";
        case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}

// CUDA's own text, then the simulator's detail about the last error of that kind.
const char* cudaGetErrorString(cudaError_t err) {
    const char* text = "unrecognized error code";
    switch (err) {
        case cudaSuccess: text = "no error"; break;
        case cudaErrorInvalidValue: text = "invalid argument"; break;
        case cudaErrorMemoryAllocation: text = "out of memory"; break;
        case cudaErrorInvalidConfiguration: text = "invalid configuration argument"; break;
        case cudaErrorInvalidDeviceFunction: text = "invalid device function"; break;
        case cudaErrorNoDevice: text = "no CUDA-capable device is detected"; break;
        case cudaErrorInvalidResourceHandle: text = "invalid resource handle"; break;
        case cudaErrorIllegalState: text = "the operation cannot be performed in the present state"; break;
        case cudaErrorNotReady: text = "device not ready"; break;
        case cudaErrorLaunchFailure: text = "unspecified launch failure"; break;
    }
    thread_local std::string s;
    s = text;
    const auto& d = device();
    if (err != cudaSuccess && !d.detail.empty()) s += " (CUDA simulator: " + d.detail + ")";
    return s.c_str();
}

cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total) {
    SIM_STICKY();
    auto& d = device();
    DeviceScope scope(d);
    std::size_t used = 0;
    for (const auto& a : d.allocations) used += a.second;
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    *total = p.totalGlobalMem;
    *free_bytes = *total > used ? *total - used : 0;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, std::size_t bytes) {
    SIM_STICKY();
    auto& d = device();
    DeviceScope scope(d);
#ifdef CUDA_SIM_ASAN
    // Exactly `bytes` long, so that AddressSanitizer catches an access one past the end.
    void* p = ::operator new(bytes ? bytes : 1, std::align_val_t(256), std::nothrow);
#else
    // Whole pages of their own, the data at their end, a guard page either side (see Pages).
    const std::size_t page = cuda_sim::page_bytes(), align = cuda_sim::device_alignment;
    const std::size_t data = (std::max<std::size_t>(bytes, 1) + align - 1) / align * align;
    const std::size_t inner = (data + page - 1) / page * page;
    void* p = nullptr;
    void* m = mmap(nullptr, inner + 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
        char* base = static_cast<char*>(m);
        mprotect(base, page, PROT_NONE);
        mprotect(base + page + inner, page, PROT_NONE);
        p = base + page + inner - data;
    }
#endif
    if (!p) return error(cudaErrorMemoryAllocation, "cudaMalloc: " + std::to_string(bytes) + " bytes");
    std::memset(p, 0xff, bytes);  // uninitialised device memory: NaN floats, -1 ints
    d.allocations[reinterpret_cast<std::uintptr_t>(p)] = bytes;
#ifndef CUDA_SIM_ASAN
    if (d.guard_device) cuda_sim::note_opened(reinterpret_cast<std::uintptr_t>(p));  // closed when the call ends
#endif
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
    if (!ptr) return cudaSuccess;
    auto& d = device();
    DeviceScope scope(d);
    flush_all(d);  // cudaFree waits for the device's work
    const auto it = d.allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == d.allocations.end()) {
        return error(cudaErrorInvalidValue, "cudaFree: not a pointer from cudaMalloc");
    }
#ifdef CUDA_SIM_ASAN
    ::operator delete(ptr, std::align_val_t(256));
#else
    const cuda_sim::Pages p = cuda_sim::pages_of(it->first, it->second);
    munmap(reinterpret_cast<char*>(p.first) - cuda_sim::page_bytes(), p.length + 2 * cuda_sim::page_bytes());
#endif
    d.allocations.erase(it);
    return d.sticky;
}

cudaError_t cudaMallocHost(void** ptr, std::size_t bytes) {
    SIM_STICKY();
    auto& d = device();
    DeviceScope scope(d);
    // Whole pages, as CUDA gives (a queued copy can then protect them; see guard_pinned),
    // and an inaccessible page after them: an overrun past the last page faults.
    void* p = mmap(nullptr, cuda_sim::pinned_mapping(bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return error(cudaErrorMemoryAllocation, "cudaMallocHost: out of memory");
    mprotect(static_cast<char*>(p) + cuda_sim::pinned_mapping(bytes) - cuda_sim::page_bytes(), cuda_sim::page_bytes(),
             PROT_NONE);
    d.pinned[reinterpret_cast<std::uintptr_t>(p)] = bytes;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
    if (!ptr) return cudaSuccess;
    auto& d = device();
    DeviceScope scope(d);
    flush_all(d);  // cudaFreeHost waits for the device's work
    const auto it = d.pinned.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == d.pinned.end()) {
        return error(cudaErrorInvalidValue, "cudaFreeHost: not a pointer from cudaMallocHost");
    }
    munmap(ptr, cuda_sim::pinned_mapping(it->second));
    d.pinned.erase(it);
    return d.sticky;
}

namespace {
// The checks of a copy: cudaSuccess, with the device pointers it uses in device_sides, or the
// error (recorded with its detail) to return.
cudaError_t check_copy(const char* call, void* dst, const void* src, std::size_t bytes,
                       cudaMemcpyKind kind, std::vector<const void*>* device_sides) {
    const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (dst_dev) {
        if (const cudaError_t e = check_device_range(call, "destination", dst, bytes)) return e;
        device_sides->push_back(dst);
    }
    if (src_dev) {
        if (const cudaError_t e = check_device_range(call, "source", src, bytes)) return e;
        device_sides->push_back(src);
    }
    return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                       const char* file, int line) {
    SIM_STICKY();
    auto& d = device();
    DeviceScope scope(d);
    std::vector<const void*> device_sides;
    if (const cudaError_t e = check_copy("cudaMemcpy", dst, src, bytes, kind, &device_sides)) return e;
    const std::string race =
        cuda_sim::race_with_queued(d, "cudaMemcpy at " + cuda_sim::where(file, line),
                                   cuda_sim::allocations_of(d, device_sides));
    if (!race.empty()) return cuda_sim::refuse_race(race);
    if (bytes) std::memmove(dst, src, bytes);
    return cudaSuccess;
}

// On a non-blocking stream the copy is queued, as a GPU's is, with CUDA's exceptions for
// pageable host memory: a copy from it reads the host bytes at the call (CUDA stages them),
// a copy to it returns only once the stream has run up to and including the copy.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream, const char* file, int line) {
    SIM_STICKY();
    auto& d = device();
    DeviceScope scope(d);
    if (stream && !d.streams.count(stream)) {
        return error(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: a destroyed stream");
    }
    if (!queues(stream)) return cudaMemcpy(dst, src, bytes, kind, file, line);
    const std::string what = "cudaMemcpyAsync at " + cuda_sim::where(file, line);
    std::vector<const void*> device_sides;
    if (const cudaError_t e = check_copy("cudaMemcpyAsync", dst, src, bytes, kind, &device_sides)) return e;
    if (bytes == 0) return cudaSuccess;
    auto allocations = cuda_sim::allocations_of(d, device_sides);
    if (kind == cudaMemcpyHostToDevice && !cuda_sim::is_pinned(d, src, bytes)) {
        auto staged = std::make_shared<std::vector<unsigned char>>(
            static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + bytes);
        stream->pending.push_back({what, std::move(allocations),
                                   [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); }});
    } else if (kind == cudaMemcpyDeviceToHost && !cuda_sim::is_pinned(d, dst, bytes)) {
        flush(d, stream);
        SIM_STICKY();
        std::memmove(dst, src, bytes);
    } else {
        // Pinned memory that the copy writes (or reads) later: host code that reads or writes
        // it (or writes it) before the stream is synchronised is stopped with the copy's name.
        std::function<void()> release;
        if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToDevice) {
            const bool into_host = kind == cudaMemcpyDeviceToHost;
            release = cuda_sim::guard_pinned(into_host ? dst : src, bytes, into_host, what);
        }
        stream->pending.push_back({what, std::move(allocations),
                                   [dst, src, bytes] { std::memmove(dst, src, bytes); }, std::move(release)});
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy2D(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                         std::size_t width, std::size_t height, cudaMemcpyKind kind) {
    if (width > dpitch || width > spitch) {
        return error(cudaErrorInvalidValue, "cudaMemcpy2D: width " + std::to_string(width) +
                                                " is wider than a pitch");
    }
    for (std::size_t row = 0; row < height; ++row) {
        const cudaError_t e = cudaMemcpy(static_cast<char*>(dst) + row * dpitch,
                                         static_cast<const char*>(src) + row * spitch, width, kind);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                              std::size_t width, std::size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
    if (width > dpitch || width > spitch) {
        return error(cudaErrorInvalidValue, "cudaMemcpy2DAsync: width " + std::to_string(width) +
                                                " is wider than a pitch");
    }
    for (std::size_t row = 0; row < height; ++row) {
        const cudaError_t e = cudaMemcpyAsync(static_cast<char*>(dst) + row * dpitch,
                                              static_cast<const char*>(src) + row * spitch, width,
                                              kind, stream);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t cudaMemset(void* ptr, int value, std::size_t bytes, const char* file, int line) {
    SIM_STICKY();
    auto& d = device();
    DeviceScope scope(d);
    if (const cudaError_t e = check_device_range("cudaMemset", "destination", ptr, bytes)) return e;
    const std::string race = cuda_sim::race_with_queued(d, "cudaMemset at " + cuda_sim::where(file, line),
                                                        cuda_sim::allocations_of(d, {ptr}));
    if (!race.empty()) return cuda_sim::refuse_race(race);
    if (bytes) std::memset(ptr, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, std::size_t bytes, cudaStream_t stream,
                            const char* file, int line) {
    SIM_STICKY();
    auto& d = device();
    DeviceScope scope(d);
    if (stream && !d.streams.count(stream)) {
        return error(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: a destroyed stream");
    }
    if (!queues(stream)) return cudaMemset(ptr, value, bytes, file, line);
    if (const cudaError_t e = check_device_range("cudaMemsetAsync", "destination", ptr, bytes)) return e;
    if (bytes)
        stream->pending.push_back({"cudaMemsetAsync at " + cuda_sim::where(file, line),
                                   cuda_sim::allocations_of(d, {ptr}),
                                   [ptr, value, bytes] { std::memset(ptr, value, bytes); }});
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
    SIM_STICKY();
    auto& d = device();
    DeviceScope scope(d);
    *stream = new CUstream_st{flags, {}};
    d.streams.insert(*stream);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    auto& d = device();
    DeviceScope scope(d);
    if (!d.streams.count(stream)) {
        return error(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: not a live stream");
    }
    flush(d, stream);  // its work still completes
    d.streams.erase(stream);
    for (CUevent_st* e : d.events)
        if (e->stream == stream) e->stream = nullptr;
    delete stream;
    return cudaSuccess;
}
// Runs the work queued on the stream (the legacy stream and blocking streams run theirs
// when it is enqueued).
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    SIM_STICKY();
    auto& d = device();
    DeviceScope scope(d);
    if (stream && !d.streams.count(stream)) {
        return error(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize: not a live stream");
    }
    if (stream) flush(d, stream);
    return d.sticky;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
    SIM_STICKY();
    auto& d = device();
    DeviceScope scope(d);
    *event = new CUevent_st{flags, false, true, nullptr, {}};
    d.events.insert(*event);
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    auto& d = device();
    DeviceScope scope(d);
    if (!d.events.erase(event)) {
        return error(cudaErrorInvalidResourceHandle, "cudaEventDestroy: not a live event");
    }
    delete event;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    SIM_STICKY();
    auto& d = device();
    if (!d.events.count(event) || (stream && !d.streams.count(stream))) {
        return error(cudaErrorInvalidResourceHandle, "cudaEventRecord: not a live event or stream");
    }
    event->recorded = true;
    if (queues(stream)) {  // reached when the stream's work before it has run
        event->done = false;
        event->stream = stream;
        stream->pending.push_back({"cudaEventRecord", {}, [event] {
                                       if (!device().events.count(event)) return;
                                       event->done = true;
                                       event->when = std::chrono::steady_clock::now();
                                   }});
        return cudaSuccess;
    }
    event->recorded = event->done = true;
    event->stream = nullptr;
    event->when = std::chrono::steady_clock::now();
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    SIM_STICKY();
    auto& d = device();
    DeviceScope scope(d);
    if (!d.events.count(event)) {
        return error(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: not a live event");
    }
    if (!event->done && event->stream) flush(d, event->stream);
    return d.sticky;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    SIM_STICKY();
    auto& d = device();
    if (!d.events.count(start) || !d.events.count(end) || (start->flags & cudaEventDisableTiming) ||
        (end->flags & cudaEventDisableTiming)) {
        return error(cudaErrorInvalidResourceHandle,
                     "cudaEventElapsedTime: events must be live and created with timing");
    }
    if (!start->recorded || !end->recorded) {
        return error(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event not recorded");
    }
    if (!start->done || !end->done) {
        return error(cudaErrorNotReady, "cudaEventElapsedTime: an event its stream has not "
                                        "reached yet (cudaEventSynchronize it first)");
    }
    *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
    return cudaSuccess;
}
