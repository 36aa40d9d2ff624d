#pragma once
// File helpers shared by every test tier.
#include <fstream>
#include <iterator>
#include <string>

namespace seqrec::testing {

// A file's whole contents, byte for byte ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace seqrec::testing
