# idem_test(NAME SOURCES a.cc b.cc [LIBS x y] [LABELS l] [FILTER pattern]) — a GoogleTest binary
# registered with ctest test by test (only the tests matching FILTER, when given).
function(idem_test name)
  cmake_parse_arguments(T "" "FILTER" "SOURCES;LIBS;LABELS" ${ARGN})
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
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 ${filter} PROPERTIES LABELS "${T_LABELS}")
endfunction()
