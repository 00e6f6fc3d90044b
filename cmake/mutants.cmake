# course_mutants(): every exercise's catalogue of learner mistakes, proven caught.
#
# checks/NN_slug/mutants/<name>.cpp is a copy of solutions/NN_slug/solution.cpp with one
# realistic mistake, its first line `// mistake: <what the learner got wrong>`. Each is
# built against the exercise's checks (the same checks object that judges the exercise) as
#
#   mutant_NN_<name>     the checks linked with the mistaken solution
#
# and the CTest test "NN mutant <name> is caught" (labels `mutants`, `lessonNN`) passes only
# if at least one check fails on it (a crash counts as caught). A mistake the checks cannot
# catch in principle does not belong here: checks/NN_slug/mutants/equivalent.md says why.
#
# Only the mutant's own file is compiled (without the course's -Werror: realistic mistakes
# leave unused variables); the checks object and doctest's main are shared with check_NN.
option(ATTN_MUTANTS "Build the catalogue of learner mistakes and test that the checks catch each" ON)

function(course_mutants)
  if(NOT ATTN_MUTANTS)
    return()
  endif()
  file(GLOB mutant_sources CONFIGURE_DEPENDS
       "${PROJECT_SOURCE_DIR}/checks/[0-9][0-9]_*/mutants/*.cpp")
  list(SORT mutant_sources)
  foreach(source IN LISTS mutant_sources)
    get_filename_component(mutants_dir "${source}" DIRECTORY)
    get_filename_component(exercise_dir "${mutants_dir}" DIRECTORY)
    get_filename_component(name "${exercise_dir}" NAME)
    get_filename_component(mutant "${source}" NAME_WE)
    string(SUBSTRING "${name}" 0 2 nn)
    if(NOT TARGET checks_${nn}_obj)
      message(WARNING "${source}: exercise ${nn} has no checks to catch this mistake")
      continue()
    endif()
    string(MAKE_C_IDENTIFIER "mutant_${nn}_${mutant}" target)
    add_executable(${target} "${source}")
    # Not attn_warnings: a realistic mistake may leave a variable unused, and -Werror would
    # turn that into a build failure rather than a mistake for the checks to catch.
    target_link_libraries(${target} PRIVATE checks_${nn}_obj check_support_main)
    target_precompile_headers(${target} REUSE_FROM check_support_main)
    add_test(NAME "${nn} mutant ${mutant} is caught"
             COMMAND "${PROJECT_SOURCE_DIR}/tools/expect_mutant_caught.sh"
                     $<TARGET_FILE:${target}> "${source}")
    set_tests_properties("${nn} mutant ${mutant} is caught" PROPERTIES
                         LABELS "mutants;lesson${nn}" TIMEOUT 60)
  endforeach()
endfunction()
