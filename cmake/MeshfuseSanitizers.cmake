# Sanitizer and fuzzing builds (docs/testing.md; scripts/test-sanitizers runs them in CI).
#   MESHFUSE_SANITIZE=address,undefined  AddressSanitizer + UndefinedBehaviorSanitizer
#   MESHFUSE_SANITIZE=thread             ThreadSanitizer
#   MESHFUSE_SANITIZE=""  (default)      none
#   MESHFUSE_BUILD_FUZZERS=ON            the libFuzzer targets of fuzz/ (clang only); meshfuse_core is
#                                        then compiled with coverage (-fsanitize=fuzzer-no-link)
# The flags go to every target defined after this file is included (compile and link), so the core,
# the CLI, the tests and the fuzzers agree. Findings are fatal: UBSan does not recover, so a test
# run under it fails on the first report instead of printing and passing.

set(MESHFUSE_SANITIZE "" CACHE STRING "Sanitizers for every target: address,undefined | thread | empty (none)")
option(MESHFUSE_BUILD_FUZZERS "Build the libFuzzer targets of fuzz/ (needs clang)" OFF)

if(MESHFUSE_SANITIZE)
  string(REPLACE "," ";" _mf_sanitizers "${MESHFUSE_SANITIZE}")
  foreach(_mf_s IN LISTS _mf_sanitizers)
    if(NOT _mf_s MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "MESHFUSE_SANITIZE='${MESHFUSE_SANITIZE}': expected address,undefined or thread")
    endif()
  endforeach()
  if("thread" IN_LIST _mf_sanitizers AND "address" IN_LIST _mf_sanitizers)
    message(FATAL_ERROR "MESHFUSE_SANITIZE: ThreadSanitizer cannot be combined with AddressSanitizer")
  endif()
  set(_mf_flags -fsanitize=${MESHFUSE_SANITIZE} -fno-omit-frame-pointer)
  if("undefined" IN_LIST _mf_sanitizers)
    # Every UB report fails the run.
    list(APPEND _mf_flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options(${_mf_flags})
  add_link_options(${_mf_flags})
  message(STATUS "meshfuse: sanitizers ${MESHFUSE_SANITIZE}")
endif()

if(MESHFUSE_BUILD_FUZZERS AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "MESHFUSE_BUILD_FUZZERS needs clang (libFuzzer); configure with -DCMAKE_CXX_COMPILER=clang++")
endif()
