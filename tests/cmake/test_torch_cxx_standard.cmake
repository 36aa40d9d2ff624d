# cmake -DSEQREC_SOURCE_DIR=<src> -DWORK_DIR=<scratch> -P test_torch_cxx_standard.cmake
# seqrec_torch_cxx_standard against fake Torch include trees: the first dir holding ATen/ATen.h
# decides, "#error C++20 or later" there means 20, anything else (or no ATen.h) 17.
include(${SEQREC_SOURCE_DIR}/cmake/TorchCxxStandard.cmake)
file(REMOVE_RECURSE "${WORK_DIR}")
file(WRITE "${WORK_DIR}/wheel/ATen/ATen.h"
     "#pragma once\n#if !defined(__cplusplus) || __cplusplus < 202002L\n#error C++20 or later compatible compiler is required to use ATen.\n#endif\n")
file(WRITE "${WORK_DIR}/debian/ATen/ATen.h" "#pragma once\n#if !defined(_MSC_VER) && __cplusplus < 201402L\n#error C++14 or later compatible compiler is required to use ATen.\n#endif\n")
file(MAKE_DIRECTORY "${WORK_DIR}/empty")

set(_failures 0)
function(expect_standard expected)
  seqrec_torch_cxx_standard(_got ${ARGN})
  if(NOT _got STREQUAL expected)
    message(SEND_ERROR "include dirs [${ARGN}]: expected C++${expected}, got C++${_got}")
  else()
    message(STATUS "include dirs [${ARGN}]: C++${_got}")
  endif()
endfunction()

expect_standard(20 "${WORK_DIR}/empty" "${WORK_DIR}/wheel")
expect_standard(17 "${WORK_DIR}/debian")
expect_standard(17 "${WORK_DIR}/empty")
expect_standard(17)
# The first tree with an ATen.h decides.
expect_standard(17 "${WORK_DIR}/debian" "${WORK_DIR}/wheel")
expect_standard(20 "${WORK_DIR}/wheel" "${WORK_DIR}/debian")
