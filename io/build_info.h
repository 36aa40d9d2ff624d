#pragma once
// Which code this binary is: the source tree's git revision at build time (`git describe
// --always --dirty`: a "-dirty" suffix means uncommitted changes were built; "unknown" where git
// could not tell) and the toolchain. `seqrec --version` prints it, every training sitting logs it
// ("[setup] build: ..."), checkpoints and datasets record it, and ranks of one job must agree on
// it. The seqrec executable sets the revision first thing in main (launcher/revision.cpp, the one
// file a new revision recompiles); in any other program (the test binaries) it reads "unset".
// Nothing here needs Torch.
#include <string>

namespace seqrec::io {

struct BuildInfo {
  std::string revision;    // e.g. "ebd11bc4f2a1" or "ebd11bc4f2a1-dirty"
  std::string torch;       // the LibTorch version built against
  std::string compiler;    // e.g. "GNU 12.2.0"
  std::string build_type;  // e.g. "Release"
  bool cuda = false;       // CUDA kernels compiled in
  bool mpi = false;        // the MPI backend compiled in
};

BuildInfo build_info();
void set_build_revision(const std::string& revision);

// One line: "seqrec ebd11bc4f2a1 (LibTorch 1.13.0, CPU only, MPI, GNU 12.2.0, Release)".
std::string describe_build();

}  // namespace seqrec::io
