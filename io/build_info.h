#pragma once
// Which code this binary is: the source tree's git revision at build time (`git describe
// --always --dirty`: a "-dirty" suffix means uncommitted changes were built; "unknown" outside a
// git checkout) and the toolchain. `seqrec --version` prints it, every training sitting logs it
// ("[setup] build: ..."), checkpoints record it (meta "build"), and ranks of one job must agree
// on it. Nothing here needs Torch.
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

const BuildInfo& build_info();

// One line: "seqrec ebd11bc4f2a1 (LibTorch 1.13.0, CPU only, MPI, GNU 12.2.0, Release)".
std::string describe_build();

}  // namespace seqrec::io
