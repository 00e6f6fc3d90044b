# The label float-compare: every test whose result rests on comparing floats, which
# tools/blas_kernel_sweep.sh runs once more under a second OpenBLAS kernel (./workbook test),
# so that a tolerance fitted to one kernel's order of summation fails here, not on a learner's
# machine whose CPU picks another.
#
# Every test gets the label but those named below, each with the reason it compares no float
# that another labelled test does not already run. Nobody adds the label by hand:
#   - attn_label_float_compare(), called at the end of each CMakeLists.txt that adds tests,
#     labels the tests that directory added (its TESTS property);
#   - the doctest cases, which ctest discovers at run time, are labelled by the script
#     float_compare_labels.cmake.in as ctest loads them (attn_label_discovered_float_compare()).
# tools/float_compare_labels.py (the test "tests that compare floats carry the label ...")
# reads every test's code and fails when a test case or script that compares floats is run
# by no labelled test.

# Name patterns of the tests left out, and why (pattern, reason, pattern, reason, ...).
set(ATTN_NOT_FLOAT_COMPARE
  "^lesson [0-9][0-9] runs$"
  "the docs' full runs: their program's quick run is labelled, and the pages' numbers are checked by the docs test"
  " exercise ships failing every check$"
  "the exercise as shipped throws before it computes anything"
  "^(docs |course site:|pages:)"
  "the pages and the browser: text, links and rendering"
  "^cudasim mistake "
  "a hardware rule the simulator refuses: a message, no number"
  "^(thread policy:|workbook |tests that compare floats carry|checks: the families table)"
  "the settings programs print, and the workbook's files and prompts"
  " generated mutants: |^mutation tool:"
  "the verdicts on mistakes: the checks they run are labelled as the NN solution/ tests"
  "^mpi: two hosts as network namespaces"
  "the network between two hosts: its training is run labelled on one host by the other mpi: tests")

function(_attn_float_compare_excluded name out)
  set(excluded FALSE)
  set(list ${ATTN_NOT_FLOAT_COMPARE})
  list(LENGTH list n)
  math(EXPR last "${n} - 1")
  foreach(i RANGE 0 ${last} 2)
    list(GET list ${i} pattern)
    if(name MATCHES "${pattern}")
      set(excluded TRUE)
    endif()
  endforeach()
  set(${out} ${excluded} PARENT_SCOPE)
endfunction()

# Labels float-compare on every test this directory added so far but those left out above.
function(attn_label_float_compare)
  get_directory_property(tests TESTS)
  foreach(t IN LISTS tests)
    _attn_float_compare_excluded("${t}" excluded)
    if(NOT excluded)
      set_property(TEST "${t}" APPEND PROPERTY LABELS float-compare)
    endif()
  endforeach()
endfunction()

# Labels the doctest cases this directory discovers (doctest_discover_tests), as ctest loads
# them: their discovery script sets their labels after this directory's own properties.
function(attn_label_discovered_float_compare)
  set(ATTN_DISCOVERED_DIR "${CMAKE_CURRENT_BINARY_DIR}")
  configure_file("${PROJECT_SOURCE_DIR}/cmake/float_compare_labels.cmake.in"
                 "${CMAKE_CURRENT_BINARY_DIR}/float_compare_labels.cmake" @ONLY)
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES
               "${CMAKE_CURRENT_BINARY_DIR}/float_compare_labels.cmake")
endfunction()
