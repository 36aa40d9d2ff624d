#pragma once
// Helpers for the io tests: scratch directories, compressed inputs written with the same
// libraries the reader uses, and checks on error messages.
#include <gtest/gtest.h>
#include <lzma.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/prepare.h"
#include "io/remove_tree.h"
#include "seqrec_config.h"
#include "tests/test_files.h"

namespace seqrec::testing {

namespace fs = std::filesystem;

// A fresh directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "seqrec-io-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    seqrec::io::try_remove_tree(path_);
  }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary);
  f << content;
  ASSERT_TRUE(f.good()) << path;
}

// One gzip member per part (several parts: a concatenated .gz as `cat a.gz b.gz` makes).
inline void write_gzip(const std::string& path, const std::vector<std::string>& parts) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& part : parts) {
    z_stream z{};
    ASSERT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
    std::vector<unsigned char> buf(deflateBound(&z, part.size()) + 64);
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(part.data()));
    z.avail_in = static_cast<uInt>(part.size());
    z.next_out = buf.data();
    z.avail_out = static_cast<uInt>(buf.size());
    ASSERT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
    out.write(reinterpret_cast<const char*>(buf.data()), buf.size() - z.avail_out);
    deflateEnd(&z);
  }
}
inline void write_gzip(const std::string& path, const std::string& content) {
  write_gzip(path, std::vector<std::string>{content});
}

inline void write_xz(const std::string& path, const std::string& content) {
  std::vector<uint8_t> buf(lzma_stream_buffer_bound(content.size()));
  size_t pos = 0;
  ASSERT_EQ(lzma_easy_buffer_encode(6, LZMA_CHECK_CRC64, nullptr, reinterpret_cast<const uint8_t*>(content.data()),
                                    content.size(), buf.data(), &pos, buf.size()),
            LZMA_OK);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(buf.data()), pos);
}

// Expects fn to throw a std::runtime_error whose message contains every part.
inline void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts,
                         const std::string& context = "") {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one mentioning '" << *parts.begin() << "' " << context;
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg << " " << context;
  }
}

inline io::PrepareOptions prepare_options(const std::string& format, const std::string& input, const std::string& out) {
  io::PrepareOptions o;
  o.format = format;
  o.input = input;
  o.out = out;
  o.progress = false;
  return o;
}

// All users' sequences as raw ids: user raw id -> item raw ids in stored order.
inline std::map<std::string, std::vector<std::string>> raw_sequences(const std::string& dir) {
  const auto meta = io::read_meta(dir);
  const auto seqs = io::load_shards(dir, meta, 0, 1);
  const auto users = io::read_raw_ids(dir, "user"), items = io::read_raw_ids(dir, "item");
  std::map<std::string, std::vector<std::string>> out;
  for (int64_t u = seqs.user_begin; u < seqs.user_end; ++u) {
    auto& v = out[users.at(u)];
    for (int64_t j = 0; j < seqs.length(u); ++j) v.push_back(items.at(seqs.items_of(u)[j] - 1));
  }
  return out;
}

// The shared real-data folder: $SEQREC_SHARED_DATA, else ../shared/data beside the sources.
inline std::string shared_data_dir() {
  if (const char* d = std::getenv("SEQREC_SHARED_DATA")) return d;
  return std::string(SEQREC_SOURCE_DIR) + "/../shared/data";
}

}  // namespace seqrec::testing
