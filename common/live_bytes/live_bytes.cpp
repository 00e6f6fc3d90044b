// The counting operator new and delete of live_bytes.hpp: each block carries its size in a
// 16-byte header (the alignment std::malloc gives), the live total and its peak are atomics.
#include "attn/live_bytes.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
constexpr std::size_t header = 16;
std::atomic<std::size_t> g_live{0}, g_peak{0};

void* counted(std::size_t n) {
    void* block = std::malloc(n + header);
    if (!block) return nullptr;
    *static_cast<std::size_t*>(block) = n;
    const std::size_t now = g_live.fetch_add(n, std::memory_order_relaxed) + n;
    std::size_t peak = g_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    return static_cast<char*>(block) + header;
}

void release(void* p) noexcept {
    if (!p) return;
    void* block = static_cast<char*>(p) - header;
    g_live.fetch_sub(*static_cast<std::size_t*>(block), std::memory_order_relaxed);
    std::free(block);
}
}  // namespace

namespace attn {
std::size_t live_bytes() { return g_live.load(); }
std::size_t peak_bytes() { return g_peak.load(); }
void reset_peak_bytes() { g_peak.store(g_live.load()); }
}  // namespace attn

void* operator new(std::size_t n) {
    if (void* p = counted(n)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted(n); }
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { release(p); }
