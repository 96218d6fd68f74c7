# UPROBE_SANITIZE: build the library, the tools and every test with sanitizers,
# e.g. -DUPROBE_SANITIZE=address,undefined or -DUPROBE_SANITIZE=thread (the
# `make test-asan` and `make test-tsan` targets). Every finding is fatal: a
# report fails the test that produced it. Tests that cannot run under a
# sanitizer carry the ctest label no-asan or no-tsan (tests/sanitizer_labels.cmake
# says why for each); the Makefile targets exclude them with `ctest -LE`.
set(UPROBE_SANITIZE "" CACHE STRING
    "Comma-separated -fsanitize= list for the whole build (address,undefined | thread); empty = none")
# The options of the code that must not touch a vector or x87 register (what
# the optimized path and the return trampoline run before the state is saved,
# and the consumers that declare set_vector_state_unused()): general registers
# only, and under UBSan no vptr checks either. A vptr check whose type cache
# misses (the first member call on an object of a class) calls the UBSan
# runtime, __ubsan_handle_dynamic_type_cache_miss, compiled with SSE: it
# clobbered a program's xmm0 at the first hit (opt.Levels/State.
# FilterOfAClassDerivedAfterRegistration under make test-asan). The other
# checks' handlers abort, and ASan's stack_malloc is off (the Makefile's
# detect_stack_use_after_return=0).
set(UPROBE_GPR_ONLY_OPTIONS -mgeneral-regs-only)
if(UPROBE_SANITIZE MATCHES "undefined")
  list(APPEND UPROBE_GPR_ONLY_OPTIONS -fno-sanitize=vptr)
endif()
if(UPROBE_SANITIZE STREQUAL "")
  return()
endif()
string(REPLACE "," ";" _uprobe_san_list "${UPROBE_SANITIZE}")
foreach(s IN LISTS _uprobe_san_list)
  if(NOT s MATCHES "^(address|undefined|thread)$")
    message(FATAL_ERROR "UPROBE_SANITIZE: unsupported sanitizer '${s}' (address, undefined, thread)")
  endif()
endforeach()
if("thread" IN_LIST _uprobe_san_list AND "address" IN_LIST _uprobe_san_list)
  message(FATAL_ERROR "UPROBE_SANITIZE: thread cannot be combined with address")
endif()
message(STATUS "libuprobe: sanitizers ${UPROBE_SANITIZE}")
# -g1: line tables for the reports (the sanitizer runtimes symbolize with them);
# frame pointers: usable stacks in reports from hot-path code.
add_compile_options(-fsanitize=${UPROBE_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer -g1)
add_link_options(-fsanitize=${UPROBE_SANITIZE})
# GCC 12 reports a false -Wrestrict inside libstdc++'s std::string when TSan's
# instrumentation changes its inlining (GCC PR 105651; tests/opt/regs_test.cpp):
# off in TSan builds only.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND "thread" IN_LIST _uprobe_san_list)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
endif()
# The ctest labels of the tests excluded under this build (tests/sanitizer_labels.cmake).
set(UPROBE_SANITIZE_LABELS "")
if("address" IN_LIST _uprobe_san_list OR "undefined" IN_LIST _uprobe_san_list)
  list(APPEND UPROBE_SANITIZE_LABELS no-asan)
endif()
if("thread" IN_LIST _uprobe_san_list)
  list(APPEND UPROBE_SANITIZE_LABELS no-tsan)
endif()
