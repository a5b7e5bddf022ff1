# Registers one GoogleTest binary's suites as ctest tests, at ctest time (the binary exists only
# after the build). Included by the file trainyard_add_test generates for each binary, which sets:
#   suite_binary   the test executable
#   suite_list     where the suite list is cached (rewritten when the binary is newer)
#   suite_xml_dir  where each suite's process writes its GoogleTest XML (tools/skipped_tests reads
#                  them: which tests ran, which skipped and why)
#   suite_labels   the binary's ctest labels
#   suite_timeout  seconds per test case; a suite gets this times its number of tests
#   suite_serial   suites that must run alone (timing-sensitive ones), a ;-list
#
# One process per suite instead of one per test: every process loads LibTorch (about half a
# second here), so a binary of 40 tests spends 20 s starting up when run test by test.
if(NOT EXISTS "${suite_binary}")
  add_test("${suite_binary}_NOT_BUILT" "${suite_binary}_NOT_BUILT")
  return()
endif()

if(NOT EXISTS "${suite_list}" OR "${suite_binary}" IS_NEWER_THAN "${suite_list}")
  execute_process(COMMAND "${suite_binary}" --gtest_list_tests
    OUTPUT_VARIABLE listing ERROR_VARIABLE listing_error RESULT_VARIABLE listing_status
    TIMEOUT 120)
  if(NOT listing_status EQUAL 0)
    add_test("${suite_binary}_CANNOT_LIST" "${suite_binary}" --gtest_list_tests)
    return()
  endif()
  # "Suite.\n  Test\n  Test2\n" (a parameterised suite: "Prefix/Suite.  # TypeParam = ...").
  string(REPLACE ";" "," listing "${listing}")
  string(REPLACE "\n" ";" lines "${listing}")
  set(suites)
  set(current "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
      set(current "${CMAKE_MATCH_1}")
      list(APPEND suites "${current}")
      set(count_${current} 0)
    elseif(line MATCHES "^  [^ ]" AND NOT current STREQUAL "")
      math(EXPR count_${current} "${count_${current}} + 1")
    endif()
  endforeach()
  set(cached "")
  foreach(suite IN LISTS suites)
    string(APPEND cached "${suite} ${count_${suite}}\n")
  endforeach()
  file(WRITE "${suite_list}" "${cached}")
endif()

file(STRINGS "${suite_list}" entries)
file(MAKE_DIRECTORY "${suite_xml_dir}")
foreach(entry IN LISTS entries)
  string(REPLACE " " ";" fields "${entry}")
  list(GET fields 0 suite)
  list(GET fields 1 count)
  string(REPLACE "/" "_" xml_name "${suite}")
  add_test("${suite}" "${suite_binary}" "--gtest_filter=${suite}.*"
    "--gtest_output=xml:${suite_xml_dir}/${xml_name}.xml")
  math(EXPR timeout "${suite_timeout} * ${count}")
  set_tests_properties("${suite}" PROPERTIES LABELS "${suite_labels}" TIMEOUT "${timeout}")
  list(FIND suite_serial "${suite}" serial_at)  # ctest reads this without if(IN_LIST)'s policy
  if(NOT serial_at EQUAL -1)
    set_tests_properties("${suite}" PROPERTIES RUN_SERIAL TRUE)
  endif()
endforeach()
