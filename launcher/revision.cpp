#include "launcher/revision.h"

#include <cstddef>

#include "seqrec_revision.h"

namespace seqrec {
namespace {
// The revision behind a marker, so that the one place it stands in the executable can be found
// (tests make a copy of the binary that names another revision this way). Read through a
// volatile pointer, so that the compiler keeps the whole string and reads it at run time instead
// of folding the revision into a literal of its own.
const char kMarkedRevision[] = "seqrec-revision:" SEQREC_REVISION;
constexpr std::size_t kMarkerLength = sizeof("seqrec-revision:") - 1;
}  // namespace

std::string built_revision() {
  const char* volatile marked = kMarkedRevision;
  return marked + kMarkerLength;
}

}  // namespace seqrec
