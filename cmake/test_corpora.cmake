# Short texts for the lessons' tests (cmake/course.cmake), written at configure time into
# ATTN_TEST_CORPORA: "short.txt", 30 KB from the middle of tiny shakespeare with every "e "
# spelt "é " (a different text and vocabulary, with two-byte UTF-8 characters), and
# "tiny.txt", its first 3 KB on one line (no newline character at all), too short for some
# of what the lessons do.
set(ATTN_TEST_CORPORA "${PROJECT_BINARY_DIR}/test_corpora")
set(_corpus "${PROJECT_SOURCE_DIR}/data/tinyshakespeare.txt")
if(EXISTS "${_corpus}")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_corpus}")
  foreach(_pair "short.txt;30000" "tiny.txt;3000")
    list(GET _pair 0 _file)
    list(GET _pair 1 _bytes)
    file(READ "${_corpus}" _text OFFSET 400000 LIMIT ${_bytes})  # ASCII: cut anywhere
    string(REPLACE "e " "é " _text "${_text}")
    if(_file STREQUAL "tiny.txt")
      string(REPLACE "\n" " " _text "${_text}")
    endif()
    file(WRITE "${ATTN_TEST_CORPORA}/${_file}" "${_text}")
  endforeach()
else()
  message(WARNING "data/tinyshakespeare.txt is missing (./workbook data restores it): "
                  "the lessons' tests on short texts will fail")
endif()
