# course_lesson(NN_slug): one lesson's targets and tests.
#
#   lesson_NN                       the lesson's program (lessons/NN_slug/*.cpp)
#   check_NN / check_NN_exercise    the doctest checks (checks/NN_slug/checks.cpp) linked with
#                                   the solution and with the learner's exercise
#
# CTest tests carry the labels `lessonNN` and one of lessons / solutions / exercises.
set_property(GLOBAL PROPERTY ATTN_LESSONS "")

function(course_lesson name)
  string(SUBSTRING "${name}" 0 2 nn)
  set(src "${PROJECT_SOURCE_DIR}")
  set_property(GLOBAL APPEND PROPERTY ATTN_LESSONS "${name}")

  # The lesson's program.
  file(GLOB lesson_sources CONFIGURE_DEPENDS "${src}/lessons/${name}/*.cpp")
  add_executable(lesson_${nn} ${lesson_sources})
  target_link_libraries(lesson_${nn} PRIVATE attn attn_warnings)
  target_precompile_headers(lesson_${nn} REUSE_FROM attn)
  # Lessons with a GPU part compile it under ATTN_HAVE_CUDA: against the GPU (attn_cuda)
  # where one was found at configure time, otherwise against the CUDA simulator
  # (attn_cuda_sim, which defines ATTN_CUDA_SIMULATED: results marked as such, no timings).
  if(ATTN_HAVE_CUDA AND ATTN_GPU_PRESENT AND TARGET attn_cuda)
    target_link_libraries(lesson_${nn} PRIVATE attn_cuda)
    target_compile_definitions(lesson_${nn} PRIVATE ATTN_HAVE_CUDA=1)
  elseif(TARGET attn_cuda_sim)
    set(_gpu_part FALSE)  # only lessons with a GPU part wait for the simulated library
    foreach(_f IN LISTS lesson_sources)
      file(STRINGS "${_f}" _hits REGEX "ATTN_HAVE_CUDA")
      if(_hits)
        set(_gpu_part TRUE)
      endif()
    endforeach()
    if(_gpu_part)
      target_link_libraries(lesson_${nn} PRIVATE attn_cuda_sim)
      target_compile_definitions(lesson_${nn} PRIVATE ATTN_HAVE_CUDA=1)
      if(ATTN_HAVE_CUDA)
        # ptxas's registers per kernel, which the performance model's occupancy reads at
        # run time (common/CMakeLists.txt): built with the lesson, so its first run has them.
        add_dependencies(lesson_${nn} cuda_resources)
      endif()
    endif()
  endif()
  # Lessons with a part on several processes (ATTN_HAVE_MPI in their sources) link the MPI
  # part of the library where an MPI was found (attn_mpi defines ATTN_HAVE_MPI); without one
  # they build and run their single-process parts.
  # Their tests start mpirun: each runs in temp folders of its own (tests/mpi/private_tmp.sh),
  # so that two copies of the suite can run side by side.
  set(launch "")
  if(TARGET attn_mpi)
    foreach(_f IN LISTS lesson_sources)
      file(STRINGS "${_f}" _hits REGEX "ATTN_HAVE_MPI")
      if(_hits)
        target_link_libraries(lesson_${nn} PRIVATE attn_mpi)
        set(launch "${src}/tests/mpi/private_tmp.sh")
        break()
      endif()
    endforeach()
  endif()
  # The test's output and pictures are the docs' (docs/CMakeLists.txt): the docs build
  # reuses them rather than running every lesson a second time. Where `./workbook run` has
  # already run this same program (its output is newer than the program), the test keeps
  # that run's output: each lesson runs once.
  set(output "${PROJECT_BINARY_DIR}/docs/output")
  add_test(NAME "lesson ${nn} runs"
           COMMAND ${launch} ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:lesson_${nn}>
                   -DOUTPUT=${output}/lesson${nn}.txt -DFIGURES=${output} -DREUSE=ON
                   -P "${src}/cmake/capture_output.cmake")
  # COST: started first, so that the docs and the browser test that wait for them are not
  # left running alone at the end of `ctest -j` (a fresh build has no timings of its own).
  set_tests_properties("lesson ${nn} runs" PROPERTIES LABELS "lesson${nn};lessons" COST 1000)
  # A lesson that prints measured times (a "// Timed:" line in its source) runs alone, so
  # that its numbers, which its page quotes, are not taken on a machine shared with a test.
  foreach(_f IN LISTS lesson_sources)
    file(STRINGS "${_f}" _hits REGEX "^// Timed: ")
    if(_hits)
      set_tests_properties("lesson ${nn} runs" PROPERTIES RUN_SERIAL TRUE)
    endif()
  endforeach()

  # The lesson once more at its smallest (--quick), and a lesson that reads text on a short
  # text of its own rather than tiny shakespeare (cmake/test_corpora.cmake). Under the
  # sanitize preset these are the lessons' AddressSanitizer + UndefinedBehaviorSanitizer pass.
  set(_reads_text FALSE)
  foreach(_f IN LISTS lesson_sources)
    file(STRINGS "${_f}" _hits REGEX "LessonText::corpus")
    if(_hits)
      set(_reads_text TRUE)
    endif()
  endforeach()
  if(_reads_text)
    add_test(NAME "lesson ${nn} quick, on a 30 KB text"
             COMMAND ${launch} $<TARGET_FILE:lesson_${nn}> --quick --data "${ATTN_TEST_CORPORA}/short.txt")
    set_tests_properties("lesson ${nn} quick, on a 30 KB text" PROPERTIES LABELS "lesson${nn};lessons-quick")
    # Too short for some of what a lesson does: it runs, or says why not in one line.
    add_test(NAME "lesson ${nn} quick, on a 3 KB text: runs or refuses in one line"
             COMMAND ${launch} "${src}/tools/expect_run_or_one_line.sh" $<TARGET_FILE:lesson_${nn}>
                     --quick --data "${ATTN_TEST_CORPORA}/tiny.txt")
    set_tests_properties("lesson ${nn} quick, on a 3 KB text: runs or refuses in one line"
                         PROPERTIES LABELS "lesson${nn};lessons-quick")
  else()
    add_test(NAME "lesson ${nn} quick" COMMAND ${launch} $<TARGET_FILE:lesson_${nn}> --quick)
    set_tests_properties("lesson ${nn} quick" PROPERTIES LABELS "lesson${nn};lessons-quick")
  endif()

  # The exercise, its solution and the checks they share.
  set(checks "${src}/checks/${name}/checks.cpp")
  if(EXISTS "${checks}")
    add_library(checks_${nn}_obj OBJECT "${checks}")
    target_link_libraries(checks_${nn}_obj PUBLIC attn check_support PRIVATE attn_warnings)
    target_include_directories(checks_${nn}_obj PUBLIC "${src}/exercises/${name}")
    target_precompile_headers(checks_${nn}_obj REUSE_FROM check_support_main)

    file(GLOB solution_sources CONFIGURE_DEPENDS "${src}/solutions/${name}/*.cpp")
    add_executable(check_${nn} ${solution_sources})
    file(GLOB exercise_sources CONFIGURE_DEPENDS "${src}/exercises/${name}/*.cpp")
    add_executable(check_${nn}_exercise ${exercise_sources})
    target_link_libraries(check_${nn} PRIVATE attn_warnings)
    target_link_libraries(check_${nn}_exercise PRIVATE attn_exercise_warnings)  # never -Werror
    foreach(t check_${nn} check_${nn}_exercise)
      target_link_libraries(${t} PRIVATE checks_${nn}_obj check_support_main)
      target_precompile_headers(${t} REUSE_FROM check_support_main)
    endforeach()

    # Every check passes on the solution. One label only: doctest's discovery script appends
    # "LABELS <doctest's own>" after these properties, so a second label would be lost; the
    # solution checks are found by name instead (ctest -R " solution/").
    doctest_discover_tests(check_${nn} TEST_PREFIX "${nn} solution/"
                           PROPERTIES LABELS "lesson${nn}")
    # Every check fails on the exercise as shipped: a check that cannot fail is a defect.
    # The test is skipped once the learner has edited the exercise (it would then be
    # testing their work, which `./workbook check` does).
    add_test(NAME "${nn} exercise ships failing every check"
             COMMAND "${src}/tools/expect_each_check_fails.sh"
                     $<TARGET_FILE:check_${nn}_exercise> "${src}/exercises/${name}")
    set_tests_properties("${nn} exercise ships failing every check" PROPERTIES
                         LABELS "lesson${nn};exercises" SKIP_RETURN_CODE 77)
  endif()
endfunction()
