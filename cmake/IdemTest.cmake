# idem_test(NAME SOURCES a.cc b.cc [LIBS x y] [LABELS l] [FILTER pattern] [COST n]) — a GoogleTest
# binary registered with ctest test by test (only the tests matching FILTER, when given). COST
# makes `ctest -j` start its tests first: give it to tests that take a minute, so that they do
# not run last, alone, on a fresh machine (where ctest has no timings of its own yet).
function(idem_test name)
  cmake_parse_arguments(T "" "FILTER;COST" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT IDEM_BUILD_TESTS)
    return()
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE idem idem_flags idem_testing GTest::gtest GTest::gmock
                                        GTest::gtest_main ${T_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR})
  include(GoogleTest)
  set(filter)
  if(T_FILTER)
    set(filter TEST_FILTER ${T_FILTER})
  endif()
  set(cost)
  if(T_COST)
    set(cost COST ${T_COST})
  endif()
  # Only the first label reaches ctest (gtest_discover_tests flattens a list in PROPERTIES).
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 ${filter} PROPERTIES ${cost} LABELS "${T_LABELS}")
endfunction()
