# Script mode (cmake -P), run by the seqrec_revision target at every build and once at configure
# time: writes OUT, a header naming the source tree's git revision (`git describe --always
# --dirty`), and the toolchain facts passed in, so that `seqrec --version`, every training
# sitting's log and every checkpoint say which code made them. file(CONFIGURE) rewrites OUT only
# when its text changes, so an unchanged revision recompiles nothing.
#   -DSOURCE_DIR=... -DOUT=... -DTORCH_VERSION=... -DCOMPILER=... -DBUILD_TYPE=... [-DFALLBACK=...]
# FALLBACK (the SEQREC_REVISION cache variable) names the revision where git cannot: a source
# tarball, or a copy of the tree without its .git (the GPU machine's).
# Only the source tree's own checkout counts: a tarball unpacked inside some other repository
# must not take that repository's revision.
execute_process(
  COMMAND git -C "${SOURCE_DIR}" rev-parse --show-toplevel
  OUTPUT_VARIABLE toplevel
  RESULT_VARIABLE rc
  OUTPUT_STRIP_TRAILING_WHITESPACE
  ERROR_QUIET)
set(SEQREC_REVISION "")
if(rc EQUAL 0)
  file(REAL_PATH "${SOURCE_DIR}" source_real)
  file(REAL_PATH "${toplevel}" toplevel_real)
  if(source_real STREQUAL toplevel_real)
    execute_process(
      COMMAND git -C "${SOURCE_DIR}" describe --always --dirty --abbrev=12
      OUTPUT_VARIABLE SEQREC_REVISION
      RESULT_VARIABLE rc
      OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_QUIET)
  endif()
endif()
if(NOT rc EQUAL 0 OR SEQREC_REVISION STREQUAL "")
  # A source tarball, no git, or a checkout git refuses to read (another owner).
  if(FALLBACK STREQUAL "")
    set(SEQREC_REVISION "unknown")
  else()
    set(SEQREC_REVISION "${FALLBACK}")
  endif()
endif()
if(BUILD_TYPE STREQUAL "")
  set(BUILD_TYPE "no build type")
endif()
file(CONFIGURE OUTPUT "${OUT}" CONTENT [[
#pragma once
// Generated at build time by cmake/BuildRevision.cmake; included by io/build_info.cpp only.
#define SEQREC_REVISION "@SEQREC_REVISION@"
#define SEQREC_TORCH_VERSION "@TORCH_VERSION@"
#define SEQREC_COMPILER "@COMPILER@"
#define SEQREC_BUILD_TYPE "@BUILD_TYPE@"
]] @ONLY)
