# cmake -DSEQREC_SOURCE_DIR=<src> -DWORK_DIR=<scratch> -DGENERATOR=<gen> -P test_ccache_launcher.cmake
# seqrec_use_ccache() with real ccache: one small project with a precompiled header (as every
# seqrec TU has) and a project include dir, copied to two paths and built with a fresh cache.
# The second copy must hit on every compile, none refused for the PCH; the same with
# SEQREC_CCACHE_BASEDIR empty must miss, which shows that the base directory makes the hits, and so
# must a copy configured with CCACHE_BASEDIR in the environment naming another directory; and
# the first copy, its PCH rebuilt in place (the header touched), must hit on every compile.
find_program(CCACHE ccache)
if(NOT CCACHE)
  message("SKIPPED: ccache is not installed; seqrec builds without it")
  return()
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
file(WRITE "${WORK_DIR}/ccache.conf" "")

function(write_project dir)
  file(WRITE "${dir}/CMakeLists.txt"
"cmake_minimum_required(VERSION 3.25)
project(ccache_probe LANGUAGES CXX)
include(\"${SEQREC_SOURCE_DIR}/cmake/CcacheLauncher.cmake\")
seqrec_use_ccache()
add_library(probe STATIC src/probe.cpp src/other.cpp)
target_include_directories(probe PRIVATE include)
target_precompile_headers(probe PRIVATE include/probe_pch.h)
")
  file(WRITE "${dir}/include/probe_pch.h" "#pragma once\n#include <string>\n#include <vector>\n")
  file(WRITE "${dir}/include/probe.h" "#pragma once\nint probe_size(const std::vector<std::string>& v);\n")
  file(WRITE "${dir}/src/probe.cpp" "#include \"probe.h\"\nint probe_size(const std::vector<std::string>& v) { return static_cast<int>(v.size()); }\n")
  file(WRITE "${dir}/src/other.cpp" "#include \"probe.h\"\nint probe_twice(const std::vector<std::string>& v) { return 2 * probe_size(v); }\n")
endfunction()

# Runs ccache or cmake with the test's own cache and config, none of the caller's ccache settings.
function(run_isolated)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=CCACHE_SLOPPINESS --unset=CCACHE_BASEDIR
                          --unset=CCACHE_DISABLE --unset=CCACHE_RECACHE --unset=CCACHE_NODIRECT
                          "CCACHE_DIR=${WORK_DIR}/cache" "CCACHE_CONFIGPATH=${WORK_DIR}/ccache.conf"
                          ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(run_out "${out}" PARENT_SCOPE)
endfunction()

# Counts the hits, misses and PCH refusals of one build of an existing copy.
function(rebuild_copy name dir)  # name: what the counts are of; dir: the copy
  run_isolated(${CCACHE} -z)
  run_isolated(${CMAKE_COMMAND} --build "${WORK_DIR}/${dir}/probe/build")
  run_isolated(${CCACHE} --print-stats)
  foreach(key direct_cache_hit preprocessed_cache_hit cache_miss could_not_use_precompiled_header)
    string(REGEX MATCH "(^|\n)${key}\t([0-9]+)" m "${run_out}")
    if(NOT m)
      message(FATAL_ERROR "ccache --print-stats has no ${key}:\n${run_out}")
    endif()
    set(${key} ${CMAKE_MATCH_2})
  endforeach()
  math(EXPR hits "${direct_cache_hit} + ${preprocessed_cache_hit}")
  set(hits ${hits} PARENT_SCOPE)
  set(misses ${cache_miss} PARENT_SCOPE)
  set(pch_refused ${could_not_use_precompiled_header} PARENT_SCOPE)
  message(STATUS "${name}: ${hits} hits, ${cache_miss} misses, ${could_not_use_precompiled_header} refused for the PCH")
endfunction()

function(build_copy name configure_env)  # configure_env: "" or NAME=VALUE; ARGN: configure arguments
  write_project("${WORK_DIR}/${name}/probe")
  run_isolated(${configure_env} ${CMAKE_COMMAND} -S "${WORK_DIR}/${name}/probe" -B "${WORK_DIR}/${name}/probe/build"
               -G "${GENERATOR}" ${ARGN})
  rebuild_copy(${name} ${name})
  set(hits ${hits} PARENT_SCOPE)
  set(misses ${misses} PARENT_SCOPE)
  set(pch_refused ${pch_refused} PARENT_SCOPE)
endfunction()

# The PCH and the two sources: three compiles.
build_copy(first "")
if(NOT misses EQUAL 3 OR NOT pch_refused EQUAL 0)
  message(SEND_ERROR "first build: expected 3 misses and no PCH refusals, got ${misses} and ${pch_refused}")
endif()
# The PCH rebuilt where the old one still lies (its header touched, its content the same): ccache
# hashes an existing .gch into the key of the compile that regenerates it (ccache issue #1196),
# so without the launcher removing the old one first this and everything after it miss.
file(TOUCH "${WORK_DIR}/first/probe/include/probe_pch.h")
rebuild_copy(first_rebuilt first)
if(NOT hits EQUAL 3 OR NOT misses EQUAL 0)
  message(SEND_ERROR "the PCH regenerated over its old .gch: expected 3 hits and no misses, got ${hits} and ${misses}")
endif()
build_copy(second_path "")
if(NOT hits EQUAL 3 OR NOT misses EQUAL 0)
  message(SEND_ERROR "a copy at another path: expected 3 hits and no misses, got ${hits} and ${misses}")
endif()
build_copy(without_basedir "" -DSEQREC_CCACHE_BASEDIR=)
if(NOT misses EQUAL 3)
  message(SEND_ERROR "with SEQREC_CCACHE_BASEDIR empty: expected 3 misses, got ${misses} (${hits} hits)")
endif()
build_copy(env_basedir "CCACHE_BASEDIR=${WORK_DIR}/elsewhere")
if(NOT misses EQUAL 3)
  message(SEND_ERROR "with CCACHE_BASEDIR=${WORK_DIR}/elsewhere at configure: expected 3 misses, got ${misses} (${hits} hits)")
endif()
