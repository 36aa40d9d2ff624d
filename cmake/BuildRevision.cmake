# Script mode (cmake -P), run by the seqrec_revision target at every build and once at configure
# time: writes OUT, a header naming the source tree's git revision (`git describe --always
# --dirty`), so that `seqrec --version`, every training sitting's log, every checkpoint and every
# dataset say which code made them. file(CONFIGURE) rewrites OUT only when its text changes, and
# only launcher/revision.cpp includes it, so a new revision recompiles one file and relinks the
# seqrec executable alone.
#   -DSOURCE_DIR=... -DOUT=... [-DFALLBACK=...]
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
file(CONFIGURE OUTPUT "${OUT}" CONTENT [[
#pragma once
// Generated at build time by cmake/BuildRevision.cmake; included by launcher/revision.cpp only.
#define SEQREC_REVISION "@SEQREC_REVISION@"
]] @ONLY)
