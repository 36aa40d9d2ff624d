#include "io/build_info.h"

#include "seqrec_config.h"
#include "seqrec_revision.h"

namespace seqrec::io {
namespace {
// The revision behind a marker, so that the one place it stands in the executable can be found
// (tests make a copy of the binary that names another revision this way). Read through a
// volatile pointer, so that the compiler keeps the whole string and reads it at run time
// instead of folding the revision into a literal of its own.
const char kMarkedRevision[] = "seqrec-revision:" SEQREC_REVISION;
constexpr size_t kMarkerLength = sizeof("seqrec-revision:") - 1;
}  // namespace

const BuildInfo& build_info() {
  const char* volatile marked = kMarkedRevision;
  static const BuildInfo info{marked + kMarkerLength, SEQREC_TORCH_VERSION, SEQREC_COMPILER, SEQREC_BUILD_TYPE,
                              SEQREC_HAVE_CUDA != 0, SEQREC_HAVE_MPI != 0};
  return info;
}

std::string describe_build() {
  const BuildInfo& b = build_info();
  return "seqrec " + b.revision + " (LibTorch " + b.torch + ", " + (b.cuda ? "CUDA kernels" : "CPU only") + ", " +
         (b.mpi ? "MPI" : "no MPI") + ", " + b.compiler + ", " + b.build_type + ")";
}

}  // namespace seqrec::io
