# One helper per kind of target. Every target links seqrec_warnings and reuses the one
# precompiled header (Torch), which is built once for seqrec_pch.

add_library(seqrec_warnings INTERFACE)
target_compile_options(seqrec_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-sign-compare>)
if(SEQREC_SANITIZE)
  list(JOIN SEQREC_SANITIZE "," _san)
  target_compile_options(seqrec_warnings INTERFACE -fsanitize=${_san} -fno-omit-frame-pointer)
  target_link_options(seqrec_warnings INTERFACE -fsanitize=${_san})
endif()

add_library(seqrec_pch STATIC ${CMAKE_SOURCE_DIR}/cmake/pch.cpp)
target_link_libraries(seqrec_pch PUBLIC ${TORCH_LIBRARIES} seqrec_warnings)
target_include_directories(seqrec_pch PUBLIC ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/generated)
target_precompile_headers(seqrec_pch PRIVATE <torch/torch.h>)

# Tests find the CLI and the shared data through the environment.
set(SEQREC_TEST_ENV "SEQREC_SHARED_DATA=${CMAKE_SOURCE_DIR}/../shared/data;OMP_WAIT_POLICY=PASSIVE"
    "SEQREC_BIN=${CMAKE_BINARY_DIR}/seqrec" "SEQREC_SOURCE_DIR=${CMAKE_SOURCE_DIR}")

function(_seqrec_common target)
  target_link_libraries(${target} PUBLIC seqrec_pch)
  target_precompile_headers(${target} REUSE_FROM seqrec_pch)
endfunction()

# seqrec_add_executable(NAME SOURCES ... DEPS ...): tools and benchmark drivers.
function(seqrec_add_executable name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  _seqrec_common(${name})
  target_link_libraries(${name} PRIVATE ${A_DEPS})
endfunction()

# seqrec_add_library(NAME SOURCES ... DEPS ...)
function(seqrec_add_library name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${A_SOURCES})
  _seqrec_common(${name})
  target_link_libraries(${name} PUBLIC ${A_DEPS})
endfunction()

# seqrec_add_test(NAME SOURCES ... DEPS ... [LABELS ...] [TIMEOUT s])
function(seqrec_add_test name)
  cmake_parse_arguments(A "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  _seqrec_common(${name})
  target_link_libraries(${name} PRIVATE ${A_DEPS} GTest::gtest_main)
  if(NOT A_LABELS)
    set(A_LABELS unit)
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT}
    ENVIRONMENT "${SEQREC_TEST_ENV}")
endfunction()

# seqrec_add_mpi_test(NAME NPROC SOURCES ... DEPS ...): the same GoogleTest binary run
# under mpirun with NPROC real processes (root- and oversubscribe-safe).
function(seqrec_add_mpi_test name nproc)
  cmake_parse_arguments(A "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT SEQREC_HAVE_MPI)
    return()
  endif()
  if(NOT TARGET ${name})
    add_executable(${name} ${A_SOURCES})
    _seqrec_common(${name})
    target_link_libraries(${name} PRIVATE ${A_DEPS} GTest::gtest_main)
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  add_test(NAME ${name}_np${nproc}
    COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe ${MPIEXEC_NUMPROC_FLAG} ${nproc}
            -x OMP_WAIT_POLICY=PASSIVE $<TARGET_FILE:${name}>)
  set_tests_properties(${name}_np${nproc} PROPERTIES LABELS "mpi" TIMEOUT ${A_TIMEOUT} PROCESSORS ${nproc}
    ENVIRONMENT "${SEQREC_TEST_ENV}")
endfunction()
