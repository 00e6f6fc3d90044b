/// @file fault.hpp
/// @brief A fault injected on purpose, for the checks that a job of ranks ends in one line
/// when one rank fails mid-run (lesson 21).
///
/// The environment variable `ATTN_FAULT=where:rank:nth` makes the `nth` call (counted from
/// 1) of fault_point(where, rank) in the process of that rank throw std::runtime_error
/// ("injected fault at where, call nth"). Unset, or naming another place or rank, it does
/// nothing: the points are compiled in always and cost a comparison each. The places:
/// - `step`: the main thread, after a training step (train_gpt);
/// - `take`: ZeRO stages 2 and 3's gradient sink, in an OpenMP region's master thread;
/// - `gather`: ZeRO stage 3's weight gather, on its communication thread (rethrown by the
///   pass that waits for it, in an OpenMP region);
/// - `bucket`: plain data parallelism's gradient hook, in an OpenMP region's master thread.
#pragma once

namespace attn {

/// Throws std::runtime_error when `ATTN_FAULT` names this place, this rank and this call.
/// Thread-safe: each place counts its calls in this process.
/// @param where the place's name @param rank this process's rank (0 alone)
void fault_point(const char* where, int rank);

}  // namespace attn
