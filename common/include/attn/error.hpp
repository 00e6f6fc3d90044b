/// @file error.hpp
/// @brief The exception an unfinished exercise throws.
#pragma once

#include <stdexcept>
#include <string>

namespace attn {

/// Thrown by the shipped exercises where the learner still has code to write.
///
/// It derives from std::logic_error, not std::invalid_argument, so a check that expects
/// a bad-shape error cannot be satisfied by an exercise that is not written yet.
class NotImplemented : public std::logic_error {
public:
    /// @param what_to_write one sentence naming what the learner should write
    explicit NotImplemented(const std::string& what_to_write)
        : std::logic_error("not written yet: " + what_to_write) {}
};

}  // namespace attn
