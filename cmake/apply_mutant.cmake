# cmake -DPATCH=... -DSOLUTION=... -DDIFF=... -DOUTPUT=... -DSHOWN=... -P apply_mutant.cmake
#
# Writes OUTPUT, the solution with the mistake of one of checks/NN_slug/mutants/*.diff. The
# diff's context must match the solution exactly (no fuzz; patch may still find it a few
# lines away): a diff that no longer fits the solution stops the build, naming itself.
execute_process(
  COMMAND "${PATCH}" --quiet --batch --fuzz=0 --reject-file=- -o "${OUTPUT}" "${SOLUTION}" "${DIFF}"
  RESULT_VARIABLE status
  OUTPUT_VARIABLE out
  ERROR_VARIABLE out)
if(NOT status EQUAL 0)
  file(REMOVE "${OUTPUT}")
  message(FATAL_ERROR "${SHOWN} no longer applies to the solution it mutates; make the mistake "
                      "in a copy of the solution again and rewrite the diff (README, \"The test "
                      "suite\").\n${out}")
endif()
