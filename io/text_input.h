#pragma once
// Streaming line reader over plain, gzip and xz files. The compression is recognised by
// the file's magic bytes, not its name. While reading it hashes the decompressed bytes
// (the dataset's source checksum) and tracks the compressed position (progress and ETA).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/sha256.h"

namespace seqrec::io {

class TextInput {
 public:
  // Throws std::runtime_error naming the path when it cannot be opened.
  explicit TextInput(const std::string& path);
  ~TextInput();
  TextInput(const TextInput&) = delete;
  TextInput& operator=(const TextInput&) = delete;

  // The next line without its '\n' (and without a trailing '\r', so CRLF files read the
  // same); false at the end of the input. The view stays valid until the next call.
  bool next_line(std::string_view& line);
  // 1-based number of the line last returned by next_line.
  int64_t line_number() const { return line_number_; }

  const std::string& path() const { return path_; }
  const char* compression() const;     // "none", "gzip" or "xz"
  int64_t file_size() const { return file_size_; }
  int64_t compressed_position() const;  // bytes of the file consumed so far
  // sha256 of all decompressed bytes; call after next_line returned false.
  std::string sha256_hex();

  class Decoder;  // one implementation per compression, defined in the .cpp

 private:
  bool refill();

  std::string path_;
  std::unique_ptr<Decoder> decoder_;
  Sha256 sha_;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;
  bool eof_ = false;
  int64_t line_number_ = 0;
  int64_t file_size_ = 0;
};

}  // namespace seqrec::io
