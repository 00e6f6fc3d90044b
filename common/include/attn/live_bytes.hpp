/// @file live_bytes.hpp
/// @brief The bytes a program holds through `new` (every std::vector's buffer, every string),
/// now and at their peak: what lesson 21 and its tests measure of a rank at each phase of
/// training, saving and resuming, exactly and the same in every run (unlike the resident set,
/// which counts what the allocator keeps and what the kernel has not taken back).
///
/// A program that calls these links the target `attn_live_bytes`, which replaces the global
/// `operator new` and `operator delete` with ones that count (a 16-byte header before each
/// block holds its size); no other program does. Blocks allocated with an alignment above
/// 16 bytes (the aligned forms of `new`) are not counted.
#pragma once

#include <cstddef>

namespace attn {

/// The bytes allocated through `new` and not yet deleted.
std::size_t live_bytes();
/// The largest live_bytes() since the last reset_peak_bytes() (or the program's start).
std::size_t peak_bytes();
/// Starts a new peak from live_bytes(): peak_bytes() then covers what comes after.
void reset_peak_bytes();

}  // namespace attn
