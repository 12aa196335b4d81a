# idem_test(NAME SOURCES a.cc b.cc [LIBS x y] [LABELS l] [WHOLE] [COST n]) — a GoogleTest binary
# registered with ctest.
#
# By default each of its tests is a ctest test of its own (one process per test), so that
# `ctest -j` spreads a binary's slow tests over the cores. WHOLE registers the binary as one ctest
# test instead, all its tests in one process: for binaries of many quick tests, where starting a
# process (~0.25 s under ASan) costs more than the tests (the contract suite's 410 memory and log
# tests: 8 s in one process, ~100 s one process each).
#
# COST makes `ctest -j` start the binary's tests first: give it to tests that take a minute, so
# that they do not run last, alone, on a fresh machine (where ctest has no timings of its own).
function(idem_test name)
  cmake_parse_arguments(T "WHOLE" "COST" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT IDEM_BUILD_TESTS)
    return()
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE idem idem_flags idem_testing GTest::gtest GTest::gmock
                                        GTest::gtest_main ${T_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR})
  set(cost)
  if(T_COST)
    set(cost COST ${T_COST})
  endif()
  if(T_WHOLE)
    add_test(NAME ${name} COMMAND ${name})
    # A skipped test fails the binary: no test here may skip quietly.
    set_tests_properties(${name} PROPERTIES ${cost} LABELS "${T_LABELS}"
                                            FAIL_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
    return()
  endif()
  include(GoogleTest)
  # Only the first label reaches ctest (gtest_discover_tests flattens a list in PROPERTIES).
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES ${cost} LABELS "${T_LABELS}")
endfunction()
