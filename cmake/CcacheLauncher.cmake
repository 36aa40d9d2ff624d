# seqrec_use_ccache(): when ccache is found, every C, C++ and CUDA compile goes through it with
# the settings this project needs, set in the launcher itself so that a plain cmake build gets
# them, not only ./setup.sh. tests/cmake/test_ccache_launcher.cmake builds a small project with
# it at two paths and checks the second hits, and that a PCH rebuilt in place hits.
#
# SEQREC_CCACHE_SLOPPINESS: every TU takes the shared precompiled header through -include;
# without these settings ccache 4.7 refuses all of them ("could not use precompiled header": 231
# of 231 calls uncacheable, 2026-12-03), and with them a hit costs ~1 s against ~20 s.
#
# SEQREC_CCACHE_BASEDIR: ccache rewrites absolute paths under its base directory to relative
# ones before hashing, so that a clone at another path (or CI's fresh checkout) hits what an
# earlier clone compiled (2026-12-03: the PCH and io/dataset.cpp in a second clone, 2 of 2 hits,
# 3.5 s against 75 s; the restored PCH is byte-identical, so the TUs that include it hit too).
#
# A CCACHE_SLOPPINESS or CCACHE_BASEDIR in the environment at the first configure is taken
# instead of the default; an empty SEQREC_CCACHE_BASEDIR hashes absolute paths.
#
# The launcher runs ccache through cmake/ccache-compile.sh, which removes an old precompiled
# header before the compile that regenerates it: ccache hashes an existing .gch into that
# compile's key (ccache issue #1196), so a PCH rebuilt in a build folder that held one (a header
# touched, a flag changed back) missed, and so did every TU after it (2026-12-03: 0 of 3 hits in
# the test's probe; 3 of 3 with the removal; in a CI clone's build/, the PCH's input touched:
# 91 of 91 compiles hit, 148 s for the whole rebuild beside two training runs).

set(_SEQREC_CCACHE_COMPILE "${CMAKE_CURRENT_LIST_DIR}/ccache-compile.sh")

# out = $ENV{env} when that is set, else default.
function(_seqrec_env_or_default out env default)
  if(DEFINED ENV{${env}})
    set(${out} "$ENV{${env}}" PARENT_SCOPE)
  else()
    set(${out} "${default}" PARENT_SCOPE)
  endif()
endfunction()

macro(seqrec_use_ccache)
  find_program(CCACHE_PROGRAM ccache)
  if(CCACHE_PROGRAM)
    _seqrec_env_or_default(_seqrec_sloppiness CCACHE_SLOPPINESS
                           "pch_defines,time_macros,include_file_mtime,include_file_ctime")
    set(SEQREC_CCACHE_SLOPPINESS "${_seqrec_sloppiness}" CACHE STRING
        "CCACHE_SLOPPINESS the compiler launcher runs ccache with")
    _seqrec_env_or_default(_seqrec_basedir CCACHE_BASEDIR "${CMAKE_SOURCE_DIR}")
    set(SEQREC_CCACHE_BASEDIR "${_seqrec_basedir}" CACHE PATH
        "CCACHE_BASEDIR the compiler launcher runs ccache with (empty: absolute paths are hashed)")
    set(SEQREC_LAUNCHER ${CMAKE_COMMAND} -E env "CCACHE_SLOPPINESS=${SEQREC_CCACHE_SLOPPINESS}"
        "CCACHE_BASEDIR=${SEQREC_CCACHE_BASEDIR}" /bin/sh ${_SEQREC_CCACHE_COMPILE} ${CCACHE_PROGRAM})
    set(CMAKE_C_COMPILER_LAUNCHER ${SEQREC_LAUNCHER})
    set(CMAKE_CXX_COMPILER_LAUNCHER ${SEQREC_LAUNCHER})
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${SEQREC_LAUNCHER})
  endif()
endmacro()
