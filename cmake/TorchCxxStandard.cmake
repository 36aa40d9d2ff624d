# seqrec_torch_cxx_standard(<out-var> <include-dir>...)
# Sets <out-var> to the C++ standard the Torch headers in the first include dir holding
# ATen/ATen.h ask for: 20 when that header stops with "#error C++20 or later" below C++20 (recent
# PyTorch wheels; their imported target does not always say so), else 17 (Debian's LibTorch 1.13,
# and no ATen.h found). Tested by tests/cmake/test_torch_cxx_standard.cmake.
function(seqrec_torch_cxx_standard out_var)
  set(_standard 17)
  foreach(_dir IN LISTS ARGN)
    if(EXISTS "${_dir}/ATen/ATen.h")
      file(STRINGS "${_dir}/ATen/ATen.h" _needs_cxx20 REGEX "C\\+\\+20 or later")
      if(_needs_cxx20)
        set(_standard 20)
      endif()
      break()
    endif()
  endforeach()
  set(${out_var} ${_standard} PARENT_SCOPE)
endfunction()
