#pragma once
// SHA-256 (FIPS 180-4), streaming. Implemented here because the only crypto libraries on
// the target machines are not build dependencies of the project, and the dataset checksum
// needs nothing more than this.
#include <cstddef>
#include <cstdint>
#include <string>

namespace seqrec::io {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  // Finishes the hash and returns it as 64 lowercase hex digits; the object is then spent.
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);

  uint32_t state_[8];
  uint8_t block_[64];
  size_t block_used_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace seqrec::io
