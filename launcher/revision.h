#pragma once
// The git revision this seqrec executable was built from (cmake/BuildRevision.cmake), for
// io::set_build_revision. The only file that includes the generated revision header, so a new
// revision recompiles it alone.
#include <string>

namespace seqrec {

std::string built_revision();

}  // namespace seqrec
