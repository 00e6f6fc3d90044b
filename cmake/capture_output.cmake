# Runs a lesson program and writes what it printed to OUTPUT; fails the build if the
# lesson fails, so the docs never show output of a broken program. The test "lesson NN runs",
# the docs build and `./workbook run` write the same OUTPUT, and only when the lesson exited
# 0; with REUSE set, an OUTPUT newer than PROGRAM is a successful run of this same program
# and is kept, so that each lesson runs once per build.
if(REUSE AND EXISTS "${OUTPUT}" AND NOT "${PROGRAM}" IS_NEWER_THAN "${OUTPUT}")
  message(STATUS "${OUTPUT}: kept: this program ran to the end after it was last built")
  return()
endif()
file(REMOVE "${OUTPUT}")
file(MAKE_DIRECTORY "${FIGURES}")
execute_process(COMMAND "${PROGRAM}" --figures "${FIGURES}"
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} exited with ${rc}:\n${out}\n${err}")
endif()
file(WRITE "${OUTPUT}" "${out}")
