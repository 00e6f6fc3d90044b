# Runs a lesson program and writes what it printed to OUTPUT; fails the build if the
# lesson fails, so the docs never show output of a broken program.
execute_process(COMMAND "${PROGRAM}" --figures "${FIGURES}"
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} exited with ${rc}:\n${err}")
endif()
file(WRITE "${OUTPUT}" "${out}")
