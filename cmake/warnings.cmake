# Warnings on, for the course's own code only (imported targets' headers are system headers).
set(attn_warning_flags -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion)
add_library(attn_warnings INTERFACE)
target_compile_options(attn_warnings INTERFACE
  "$<$<COMPILE_LANGUAGE:CXX>:${attn_warning_flags}>")
# The learner's exercises get the same warnings, shown but never fatal: a half-written
# exercise (a parameter not used yet) must still compile so that its checks can run.
add_library(attn_exercise_warnings INTERFACE)
target_compile_options(attn_exercise_warnings INTERFACE
  "$<$<COMPILE_LANGUAGE:CXX>:${attn_warning_flags}>")
option(ATTN_WERROR "Treat warnings as errors" OFF)
if(ATTN_WERROR)
  # A stale precompiled header only costs time: it must not fail the build.
  target_compile_options(attn_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Werror -Wno-error=invalid-pch>)
endif()

option(ATTN_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
if(ATTN_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()

# xtensor's own checks (indices in bounds, shapes named in broadcast errors), for the
# learner's debug checks (./workbook check NN --debug); every target, so that no two
# translation units see different definitions of xtensor's inline functions.
# With them, libstdc++'s own (_GLIBCXX_ASSERTIONS): an index past a std::vector's or a
# std::array's end (a tensor's shape()[2] on a 2-D tensor, which reads its strides) aborts,
# naming the container, where it would otherwise read whatever lies there.
option(ATTN_XTENSOR_ASSERT "Build with xtensor's assertions (XTENSOR_ENABLE_ASSERT) and libstdc++'s" OFF)
if(ATTN_XTENSOR_ASSERT)
  add_compile_definitions(XTENSOR_ENABLE_ASSERT _GLIBCXX_ASSERTIONS)
endif()
