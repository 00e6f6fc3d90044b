# Runs Doxygen and fails, listing them, if it printed any warning.
execute_process(COMMAND "${DOXYGEN}" "${DOXYFILE}" RESULT_VARIABLE rc
                OUTPUT_QUIET ERROR_VARIABLE err)
file(READ "${WARNINGS}" warnings)
if(NOT rc EQUAL 0 OR NOT warnings STREQUAL "")
  message(FATAL_ERROR "Doxygen reported problems (the docs must build without warnings):\n"
                      "${warnings}${err}")
endif()
