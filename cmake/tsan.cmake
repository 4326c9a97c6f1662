# Programs named *_tsan_test.cc run under ThreadSanitizer: the kernels on the CPU emulator
# (model/simt), which then sees each emulated CUDA thread as a fiber and reports shared memory
# used across a missing barrier, and header-only host code that runs threads of its own
# (model/train/batch_ahead.h). Each is built from its own source and the emulator alone, with
# -fsanitize=thread where the compiler links it and its runtime starts on this machine;
# elsewhere without (the emulator's tests then report themselves skipped with the reason).
set(tsan_skip_reason "")
file(WRITE ${CMAKE_BINARY_DIR}/tsan/probe.cc "int main() { return 0; }\n")
execute_process(
  COMMAND ${CMAKE_CXX_COMPILER} -fsanitize=thread ${CMAKE_BINARY_DIR}/tsan/probe.cc
          -o ${CMAKE_BINARY_DIR}/tsan/probe
  RESULT_VARIABLE tsan_result OUTPUT_QUIET ERROR_VARIABLE tsan_error)
if(tsan_result EQUAL 0)
  execute_process(COMMAND ${CMAKE_BINARY_DIR}/tsan/probe
    RESULT_VARIABLE tsan_result OUTPUT_QUIET ERROR_VARIABLE tsan_error)
endif()
if(NOT tsan_result EQUAL 0)
  string(REGEX REPLACE "['\n\"\\\\]" " " tsan_error "${tsan_error}")
  set(tsan_skip_reason "-fsanitize=thread did not build or run here: ${tsan_error}")
  message(STATUS "difftrain: ThreadSanitizer tests skipped: ${tsan_skip_reason}")
endif()

function(difftrain_tsan_test name src)
  add_executable(${name} ${src} ${CMAKE_SOURCE_DIR}/model/simt/simt.cc)
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE fmt::fmt GTest::gtest_main)
  if(tsan_skip_reason STREQUAL "")
    target_compile_options(${name} PRIVATE -fsanitize=thread -O1 -g)
    target_link_options(${name} PRIVATE -fsanitize=thread)
  else()
    target_compile_definitions(${name} PRIVATE DIFFTRAIN_TSAN_SKIP="${tsan_skip_reason}")
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
endfunction()
