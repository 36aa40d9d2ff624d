#include "io/build_info.h"

#include <mutex>

#include "seqrec_config.h"
#include "seqrec_toolchain.h"

namespace seqrec::io {
namespace {
std::mutex g_mutex;
std::string g_revision = "unset";
}  // namespace

void set_build_revision(const std::string& revision) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_revision = revision;
}

BuildInfo build_info() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return {g_revision, SEQREC_TORCH_VERSION, SEQREC_COMPILER, SEQREC_BUILD_TYPE, SEQREC_HAVE_CUDA != 0, SEQREC_HAVE_MPI != 0};
}

std::string describe_build() {
  const BuildInfo b = build_info();
  return "seqrec " + b.revision + " (LibTorch " + b.torch + ", " + (b.cuda ? "CUDA kernels" : "CPU only") + ", " +
         (b.mpi ? "MPI" : "no MPI") + ", " + b.compiler + ", " + b.build_type + ")";
}

}  // namespace seqrec::io
