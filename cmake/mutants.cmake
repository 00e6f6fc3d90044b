# course_mutants(): every exercise's catalogue of learner mistakes, proven caught.
#
# checks/NN_slug/mutants/<name>.diff is one realistic mistake, written as a unified diff
# against solutions/NN_slug/solution.cpp, its first line `mistake: <what the learner got
# wrong>`. At build time `patch` applies it to a copy of the solution,
#
#   build/mutants/NN_slug/<name>.cpp   the solution with the mistake,
#
# which is built against the exercise's checks (the same checks object that judges the
# exercise) as
#
#   mutant_NN_<name>     the checks linked with the mistaken solution
#
# and the CTest test "NN mutant <name> is caught" (labels `mutants`, `lessonNN`) passes only
# if at least one check fails on it within a time limit (a crash counts as caught when its
# report names the check that was running). A mistake the checks cannot catch in principle
# does not belong here: checks/NN_slug/mutants/equivalent.md says why. A diff that no longer
# applies to the solution exactly (no fuzz) stops the build, naming itself: the catalogue
# cannot drift away from the solution it mutates.
#
# A header line `says: <text>` is text the failing checks must print for it (the message
# that names the mistake; tools/expect_mutant_caught.sh).
#
# A mistake that writes out of bounds has a header line `sanitizer: <the error reported>`:
# AddressSanitizer's name for it (such as heap-buffer-overflow), `libstdc++ index out of
# bounds` for an index past a std::vector's end (libstdc++'s check, _GLIBCXX_ASSERTIONS,
# aborts first), or `xtensor index out of
# bounds` for an index past an axis that xtensor's own check finds first (the write may stay
# inside the buffer, where only that check sees it). In the sanitizer builds (ATTN_SANITIZE,
# presets `sanitize` and `check-debug`, both with xtensor's index checks) only those mutants
# are built, and the test "NN mutant <name>: the sanitizer names the line" (labels `mutants`,
# `sanitizer`, `lessonNN`) passes when the program ends within the time limit with that
# report, a stack frame in the mistaken file, and the name of the check that was running:
# what `./workbook check` shows the learner, whether the checks crash, fail or pass.
#
# Only the mutant's own file is compiled (without the course's -Werror: realistic mistakes
# leave unused variables); the checks object and doctest's main are shared with check_NN.
option(ATTN_MUTANTS "Build the catalogue of learner mistakes and test that the checks catch each" ON)

# One catalogue entry, checks/NN_slug/<kind>s/<entry>.diff, built as a program: the solution
# with the diff applied (build/<kind>s/NN_slug/<entry>.cpp) linked with the exercise's checks,
# as the target <kind>_NN_<entry>. Sets `nn`, `entry`, `patched` (the patched file) and
# `target` in the caller; `target` is empty when the exercise has no checks.
function(_course_patched_program source kind comment)
  get_filename_component(catalogue "${source}" DIRECTORY)
  get_filename_component(exercise_dir "${catalogue}" DIRECTORY)
  get_filename_component(name "${exercise_dir}" NAME)
  get_filename_component(entry "${source}" NAME_WE)
  string(SUBSTRING "${name}" 0 2 nn)
  set(patched "${CMAKE_BINARY_DIR}/${kind}s/${name}/${entry}.cpp")
  set(nn "${nn}" PARENT_SCOPE)
  set(entry "${entry}" PARENT_SCOPE)
  set(patched "${patched}" PARENT_SCOPE)
  set(target "" PARENT_SCOPE)
  if(NOT TARGET checks_${nn}_obj)
    message(WARNING "${source}: exercise ${nn} has no checks to run this ${kind} against")
    return()
  endif()
  string(MAKE_C_IDENTIFIER "${kind}_${nn}_${entry}" program)
  set(solution "${PROJECT_SOURCE_DIR}/solutions/${name}/solution.cpp")
  file(RELATIVE_PATH shown "${PROJECT_SOURCE_DIR}" "${source}")
  add_custom_command(
    OUTPUT "${patched}"
    COMMAND "${CMAKE_COMMAND}" -E make_directory "${CMAKE_BINARY_DIR}/${kind}s/${name}"
    COMMAND "${CMAKE_COMMAND}" -DPATCH=${ATTN_PATCH} -DSOLUTION=${solution} -DDIFF=${source}
            -DOUTPUT=${patched} -DSHOWN=${shown} -P "${PROJECT_SOURCE_DIR}/cmake/apply_mutant.cmake"
    DEPENDS "${solution}" "${source}" "${PROJECT_SOURCE_DIR}/cmake/apply_mutant.cmake"
    COMMENT "${kind} ${nn} ${entry}: ${comment}"
    VERBATIM)
  add_executable(${program} "${patched}")
  target_link_libraries(${program} PRIVATE checks_${nn}_obj check_support_main)
  target_precompile_headers(${program} REUSE_FROM check_support_main)
  set(target "${program}" PARENT_SCOPE)
endfunction()

function(course_mutants)
  if(NOT ATTN_MUTANTS AND NOT ATTN_SANITIZE)
    return()
  endif()
  find_program(ATTN_PATCH patch)
  if(NOT ATTN_PATCH)
    message(STATUS "mutants: no 'patch' program, so the catalogue of learner mistakes is not "
                   "built or tested (apt-get install patch, or ./workbook setup)")
    return()
  endif()
  file(GLOB mutant_sources CONFIGURE_DEPENDS
       "${PROJECT_SOURCE_DIR}/checks/[0-9][0-9]_*/mutants/*.diff")
  list(SORT mutant_sources)
  foreach(source IN LISTS mutant_sources)
    file(STRINGS "${source}" sanitizer_report LIMIT_COUNT 1 REGEX "^sanitizer: ")
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${source}")
    if(ATTN_SANITIZE AND NOT sanitizer_report)
      continue()  # the sanitizer builds test only the mistakes that write out of bounds
    endif()
    _course_patched_program("${source}" mutant "the solution with one mistake")
    if(NOT target)
      continue()
    endif()
    set(mutant "${entry}")
    set(mutated "${patched}")
    # (Not linked with attn_warnings, as variants are: a realistic mistake may leave a
    # variable unused, and -Werror would make that a build failure, not a mistake caught.)
    if(ATTN_SANITIZE)
      string(REGEX REPLACE "^sanitizer: *" "" sanitizer_report "${sanitizer_report}")
      add_test(NAME "${nn} mutant ${mutant}: the sanitizer names the line"
               COMMAND "${PROJECT_SOURCE_DIR}/tools/expect_sanitizer_report.sh"
                       $<TARGET_FILE:${target}> "${source}" "${mutated}" "${sanitizer_report}")
      set_tests_properties("${nn} mutant ${mutant}: the sanitizer names the line" PROPERTIES
                           LABELS "mutants;sanitizer;lesson${nn}" TIMEOUT 120)
    else()
      add_test(NAME "${nn} mutant ${mutant} is caught"
               COMMAND "${PROJECT_SOURCE_DIR}/tools/expect_mutant_caught.sh"
                       $<TARGET_FILE:${target}> "${source}")
      set_tests_properties("${nn} mutant ${mutant} is caught" PROPERTIES
                           LABELS "mutants;lesson${nn}" TIMEOUT 120)
    endif()
  endforeach()
endfunction()

# course_variants(): correct solutions written differently from the shipped one, proven to pass.
#
# checks/NN_slug/variants/<name>.diff is a unified diff against solutions/NN_slug/solution.cpp,
# its first line `variant: <how it is written>`: the contract's literal formula, another loop
# order, a two-pass or an online form, float64 sums. It is applied and built as a mutant is
# (variant_NN_<name>, against the same checks object), and the CTest test "NN variant <name>
# passes" (labels `variants`, `lessonNN`) passes only if every check passes on it: a check
# that rejects a right answer fails the suite. Not built in the sanitizer builds.
function(course_variants)
  if(NOT ATTN_MUTANTS OR ATTN_SANITIZE OR NOT ATTN_PATCH)
    return()
  endif()
  file(GLOB variant_sources CONFIGURE_DEPENDS
       "${PROJECT_SOURCE_DIR}/checks/[0-9][0-9]_*/variants/*.diff")
  list(SORT variant_sources)
  foreach(source IN LISTS variant_sources)
    _course_patched_program("${source}" variant "a correct solution written another way")
    if(NOT target)
      continue()
    endif()
    set(variant "${entry}")
    target_link_libraries(${target} PRIVATE attn_warnings)
    add_test(NAME "${nn} variant ${variant} passes"
             COMMAND "${PROJECT_SOURCE_DIR}/tools/expect_variant_passes.sh"
                     $<TARGET_FILE:${target}> "${source}")
    set_tests_properties("${nn} variant ${variant} passes" PROPERTIES
                         LABELS "variants;lesson${nn}" TIMEOUT 120)
  endforeach()
endfunction()

# course_generated_mutants(): mutants generated by operators from every solution, each killed
# by a check or listed as equivalent.
#
# The catalogue above holds the mistakes learners make that someone wrote down; this finds
# the ones nobody did. tools/mutation/mutate.py reads clang's syntax tree of
# solutions/NN_slug/solution.cpp and writes one program for all its mutants (a mutant schema:
# each mutant compiled in behind its number, ATTN_MUTANT=N chooses the active one):
#
#   build/mutation/NN_slug/schema.cpp      the solution with every mutant behind its switch
#   build/mutation/NN_slug/manifest.json   each mutant's number, operator, line and name
#   mutation_NN                            the schema linked with the exercise's checks
#
# The CTest test "NN generated mutants: each one killed by a check or listed as equivalent"
# (labels `mutation`, `lessonNN`) runs the checks once per mutant, stopped at the first failed
# assertion; a mutant every check passes runs once more under the sanitizers (the sanitize
# preset builds the same schema: an index one past an axis fails there, as `./workbook check`
# would show the learner). It fails on a mutant that survives both unless checks/NN_slug/equivalent.txt
# lists it with the reason no check can tell it from the solution (and on a listed one that is
# killed or no longer generated). It writes build/mutation/NN_slug/report.json, which
# `./workbook test` prints as a table of the score per exercise. Needs clang++ (Debian's clang,
# which the course's package list installs) for the syntax tree.
function(course_generated_mutants)
  if(NOT ATTN_MUTANTS AND NOT ATTN_SANITIZE)
    return()
  endif()
  find_program(ATTN_CLANGXX NAMES clang++ clang++-19 clang++-16 clang++-15 clang++-14)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(NOT ATTN_CLANGXX OR NOT Python3_Interpreter_FOUND)
    message(STATUS "mutation: no clang++ or python3, so the generated mutants are not built or "
                   "tested (apt-get install clang python3, or ./workbook setup)")
    return()
  endif()
  set(tool "${PROJECT_SOURCE_DIR}/tools/mutation/mutate.py")
  # The types the operators read come from the library's headers too: a change there may
  # change which mutants compile, so it regenerates them (in seconds).
  file(GLOB_RECURSE library_headers CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/common/include/attn/*.hpp")
  # The mutants that survive the release checks run once more as `./workbook check` runs a
  # passing exercise: under the sanitizers and xtensor's index checks, with the schemata of
  # the sanitize preset's build (./workbook test builds it before it runs the mutants).
  set(ATTN_SANITIZED_MUTANTS "${PROJECT_SOURCE_DIR}/build-sanitize" CACHE PATH
      "The sanitize preset's build folder, whose mutation_NN programs rerun the release survivors")
  get_property(lessons GLOBAL PROPERTY ATTN_LESSONS)
  foreach(name IN LISTS lessons)
    string(SUBSTRING "${name}" 0 2 nn)
    set(solution "${PROJECT_SOURCE_DIR}/solutions/${name}/solution.cpp")
    if(NOT TARGET checks_${nn}_obj OR NOT EXISTS "${solution}")
      continue()
    endif()
    set(out "${CMAKE_BINARY_DIR}/mutation/${name}")
    add_custom_command(
      OUTPUT "${out}/schema.cpp" "${out}/manifest.json"
      COMMAND "${Python3_EXECUTABLE}" "${tool}" generate "${solution}"
              --compile-commands "${CMAKE_BINARY_DIR}/compile_commands.json" --clang "${ATTN_CLANGXX}"
              --shown "solutions/${name}/solution.cpp" --out-source "${out}/schema.cpp"
              --out-manifest "${out}/manifest.json" --quiet
      DEPENDS "${solution}" "${tool}" "${PROJECT_SOURCE_DIR}/exercises/${name}/exercise.hpp" ${library_headers}
      COMMENT "mutants of solution ${nn}, generated"
      VERBATIM)
    add_executable(mutation_${nn} "${out}/schema.cpp")
    target_link_libraries(mutation_${nn} PRIVATE checks_${nn}_obj check_support_main)
    target_precompile_headers(mutation_${nn} REUSE_FROM check_support_main)
    target_compile_options(mutation_${nn} PRIVATE
                           "SHELL:-include ${PROJECT_SOURCE_DIR}/tools/mutation/schemata.hpp")
    if(ATTN_SANITIZE)
      continue()  # the sanitizer build only builds the schema, for the test below
    endif()
    set(test "${nn} generated mutants: each one killed by a check or listed as equivalent")
    add_test(NAME "${test}"
             COMMAND "${Python3_EXECUTABLE}" "${tool}" run $<TARGET_FILE:mutation_${nn}>
                     --manifest "${out}/manifest.json"
                     --equivalent "${PROJECT_SOURCE_DIR}/checks/${name}/equivalent.txt"
                     --sanitized-program "${ATTN_SANITIZED_MUTANTS}/mutation_${nn}"
                     --sanitized-manifest "${ATTN_SANITIZED_MUTANTS}/mutation/${name}/manifest.json"
                     --report "${out}/report.json" --jobs 2)
    set_tests_properties("${test}" PROPERTIES LABELS "mutation;lesson${nn}" PROCESSORS 2 TIMEOUT 900)
  endforeach()
  if(NOT ATTN_SANITIZE)
    # The tool itself: each operator's mutants, switched on in a schema, behave as the same
    # mutant written out and built alone (tools/mutation/test_mutate.py).
    add_test(NAME "mutation tool: every operator's mutants behave in the schema as written out alone"
             COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/tools/mutation/test_mutate.py"
                     --clang "${ATTN_CLANGXX}" --cxx "${CMAKE_CXX_COMPILER}" --jobs 2)
    set_tests_properties("mutation tool: every operator's mutants behave in the schema as written out alone"
                         PROPERTIES LABELS "mutation;tools" PROCESSORS 2 TIMEOUT 600)
  endif()
endfunction()
