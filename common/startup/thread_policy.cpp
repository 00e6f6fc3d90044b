// Applies the library's thread policy (attn/threads.hpp) before main. This file is not in
// the static library: CMake links its object into every program that links the library,
// because an initializer inside a static library runs only if the program happens to pull
// in the object that holds it.
#include "attn/threads.hpp"

namespace {
const bool thread_policy_applied = [] {
    attn::apply_thread_policy();
    return true;
}();
}  // namespace
