# Fills the numbers a lesson page quotes from what its program printed, so that the prose
# cannot drift away from the output.
#
# The program prints one line per quoted number: `claim <name> = <value>`
# (attn::print_claim). The page (lesson.md) writes
#   @claim{name}          replaced by the value the program printed;
#   @claim{name=value}    the value written out in the page's source, checked: the build
#                         fails unless the program printed that value (numbers may differ
#                         by one in their last digit); the page shows what was printed.
# The second form is for numbers that do not depend on the corpus or the machine; the
# first for those that do (a loss after training, a time).
#
# -DPAGE=the page with its placeholders  -DOUTPUT=the lesson's captured output
# -DRESULT=where the filled page goes  -DSOURCE=the page's path for messages
foreach(var PAGE OUTPUT RESULT SOURCE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "fill_claims.cmake: -D${var}=... is missing")
  endif()
endforeach()

file(READ "${PAGE}" text)
if(EXISTS "${OUTPUT}")
  file(STRINGS "${OUTPUT}" claim_lines REGEX "^claim [A-Za-z0-9_]+ = ")
else()
  set(claim_lines "")
endif()

string(REGEX MATCHALL "@claim{[^}]*}" placeholders "${text}")
list(REMOVE_DUPLICATES placeholders)
set(errors "")
foreach(placeholder IN LISTS placeholders)
  if(NOT placeholder MATCHES "^@claim{([A-Za-z0-9_]+)(=([^}]*))?}$")
    string(APPEND errors "  ${placeholder}: write @claim{name} or @claim{name=value}\n")
    continue()
  endif()
  set(name "${CMAKE_MATCH_1}")
  set(has_expected "${CMAKE_MATCH_2}")
  set(expected "${CMAKE_MATCH_3}")
  set(printed "")
  set(found FALSE)
  foreach(line IN LISTS claim_lines)
    if(line MATCHES "^claim ${name} = (.*)$")
      set(printed "${CMAKE_MATCH_1}")
      set(found TRUE)
    endif()
  endforeach()
  if(NOT found)
    string(APPEND errors "  ${placeholder}: the program printed no line 'claim ${name} = ...'\n")
    continue()
  endif()
  if(has_expected AND NOT expected STREQUAL printed)
    # Numbers with the same decimals may differ by one in the last digit: another BLAS or CPU
    # sums in another order, which can round the last printed digit the other way.
    set(close FALSE)
    if(expected MATCHES "^(-?)([0-9]+)\\.([0-9]+)$")
      set(e_sign "${CMAKE_MATCH_1}")
      set(e_digits "${CMAKE_MATCH_2}${CMAKE_MATCH_3}")
      string(LENGTH "${CMAKE_MATCH_3}" e_decimals)
      if(printed MATCHES "^(-?)([0-9]+)\\.([0-9]+)$")
        set(p_sign "${CMAKE_MATCH_1}")
        set(p_digits "${CMAKE_MATCH_2}${CMAKE_MATCH_3}")
        string(LENGTH "${CMAKE_MATCH_3}" p_decimals)
        if(e_decimals EQUAL p_decimals)
          string(REGEX REPLACE "^0+([0-9])" "\\1" e_digits "${e_digits}")
          string(REGEX REPLACE "^0+([0-9])" "\\1" p_digits "${p_digits}")
          math(EXPR difference "${e_sign}${e_digits} - (${p_sign}${p_digits})")
          if(difference GREATER_EQUAL -1 AND difference LESS_EQUAL 1)
            set(close TRUE)
          endif()
        endif()
      endif()
    endif()
    if(NOT close)
      string(APPEND errors
             "  ${placeholder}: the page says ${expected}, the program printed 'claim ${name} = ${printed}'\n")
      continue()
    endif()
  endif()
  string(REPLACE "${placeholder}" "${printed}" text "${text}")
endforeach()

if(errors)
  message(FATAL_ERROR "${SOURCE} does not agree with its program's output (${OUTPUT}):\n${errors}")
endif()
file(WRITE "${RESULT}" "${text}")
