# Registers one GoogleTest binary's suites as ctest tests, at ctest time (the binary exists only
# after the build). Included by the file trainyard_add_test generates for each binary, which sets:
#   suite_binary   the test executable
#   suite_list     where the suite list is cached (rewritten when the binary is newer)
#   suite_xml_dir  where each suite's process writes its GoogleTest XML (tools/skipped_tests reads
#                  them: which tests ran, which skipped and why)
#   suite_labels   the binary's ctest labels
#   suite_timeout  seconds per test case; a suite gets this times its number of tests
#   suite_serial   suites that must run alone (timing-sensitive ones), a ;-list
#   suite_shard_size  0, or the most cases one process runs: a larger suite is split into shards
#                  (GoogleTest's GTEST_TOTAL_SHARDS/GTEST_SHARD_INDEX), ctest tests "<suite>:shardK"
#   suite_cost     ctest's COST of each test: on a fresh build tree (no timings recorded yet) ctest
#                  starts the costliest first, so a long test does not start last and run alone
#   suite_processors  ctest's PROCESSORS of each test: the cores its process keeps busy (0: one)
#
# A suite named "Full..." (FullPipelineParity, or a grid instantiated as "Full/<Suite>") is the
# rest of a grid whose fast core runs under another name: it gets the label "full", which CI
# leaves out (tools/test) and `ctest -L full` runs. A suite named "Floor..." holds a timing floor
# that only a quiet machine measures (a share of the step spent waiting, say): it gets the label
# "machine", which CI leaves out too; a looser test of the same mechanism runs there.
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
  set(shards 1)
  if(suite_shard_size GREATER 0 AND count GREATER suite_shard_size)
    math(EXPR shards "(${count} + ${suite_shard_size} - 1) / ${suite_shard_size}")
  endif()
  math(EXPR last_shard "${shards} - 1")
  foreach(shard RANGE ${last_shard})
    if(shards EQUAL 1)
      set(name "${suite}")
      set(xml "${suite_xml_dir}/${xml_name}.xml")
      math(EXPR timeout "${suite_timeout} * ${count}")
    else()
      set(name "${suite}:shard${shard}")
      set(xml "${suite_xml_dir}/${xml_name}.shard${shard}.xml")
      math(EXPR timeout "${suite_timeout} * ${suite_shard_size}")
    endif()
    add_test("${name}" "${suite_binary}" "--gtest_filter=${suite}.*" "--gtest_output=xml:${xml}")
    set(labels "${suite_labels}")
    if(suite MATCHES "^Full")
      list(APPEND labels full)
    elseif(suite MATCHES "^Floor")
      list(APPEND labels machine)
    endif()
    set_tests_properties("${name}" PROPERTIES LABELS "${labels}" TIMEOUT "${timeout}"
      COST "${suite_cost}")
    if(suite_processors GREATER 1)
      set_tests_properties("${name}" PROPERTIES PROCESSORS "${suite_processors}")
    endif()
    if(shards GREATER 1)
      set_tests_properties("${name}" PROPERTIES
        ENVIRONMENT "GTEST_TOTAL_SHARDS=${shards};GTEST_SHARD_INDEX=${shard}")
    endif()
    list(FIND suite_serial "${suite}" serial_at)  # ctest reads this without if(IN_LIST)'s policy
    if(NOT serial_at EQUAL -1)
      set_tests_properties("${name}" PROPERTIES RUN_SERIAL TRUE)
    endif()
  endforeach()
endforeach()
