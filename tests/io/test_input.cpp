// The input layer: SHA-256, the plain/gzip/xz line reader, field splitting and id tables.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "io/raw_reader.h"
#include "io/remove_tree.h"
#include "io/sha256.h"
#include "io/text_input.h"
#include "io_test_util.h"

namespace {
using namespace seqrec::io;
using namespace seqrec::testing;

std::string sha(const std::string& s) {
  Sha256 h;
  h.update(s.data(), s.size());
  return h.hex_digest();
}

// What every directory removal in seqrec goes through (checkpoint pruning, failed datasets,
// the tests' scratch directories), in place of std::filesystem::remove_all, which can bind to
// the crashing copy inside PyTorch wheels' libtorch.so (io/remove_tree.h): the whole tree goes,
// a symbolic link goes without what it points to, a missing path is no error, and a failure
// names the path.
TEST(RemoveTree, RemovesTreesNotWhatLinksPointTo) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("seqrec-remove-tree-" + std::to_string(::getpid()));
  seqrec::io::remove_tree(root.string());
  fs::create_directories(root / "tree" / "a" / "b");
  fs::create_directories(root / "outside");
  std::ofstream(root / "tree" / "a" / "b" / "f.bin") << "x";
  std::ofstream(root / "tree" / "top.txt") << "y";
  std::ofstream(root / "outside" / "keep.txt") << "z";
  fs::create_directory_symlink(root / "outside", root / "tree" / "a" / "link");
  seqrec::io::remove_tree((root / "tree").string());
  EXPECT_FALSE(fs::exists(root / "tree"));
  EXPECT_TRUE(fs::exists(root / "outside" / "keep.txt")) << "a link's target was removed";
  EXPECT_EQ(seqrec::io::try_remove_tree((root / "never").string()), "");
  std::ofstream(root / "plain") << "p";
  const std::string under_file = (root / "plain" / "x").string();
  EXPECT_NE(seqrec::io::try_remove_tree(under_file).find(under_file), std::string::npos);
  seqrec::io::remove_tree(root.string());
  EXPECT_FALSE(fs::exists(root));
}

TEST(Sha256, KnownVectors) {
  // FIPS 180-4 examples.
  EXPECT_EQ(sha(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, ChunkingDoesNotMatter) {
  std::string s;
  for (int i = 0; i < 5000; ++i) s += static_cast<char>(i * 7 + 3);
  for (size_t chunk : {1, 3, 63, 64, 65, 1000}) {
    Sha256 h;
    for (size_t p = 0; p < s.size(); p += chunk) h.update(s.data() + p, std::min(chunk, s.size() - p));
    EXPECT_EQ(h.hex_digest(), sha(s)) << "chunk " << chunk;
  }
}

std::vector<std::string> all_lines(TextInput& in) {
  std::vector<std::string> out;
  std::string_view line;
  while (in.next_line(line)) out.emplace_back(line);
  return out;
}

TEST(TextInput, PlainGzipXzReadTheSameLinesAndChecksum) {
  TempDir tmp;
  // CRLF, an empty line, a line longer than the 1 MiB read buffer, no final newline.
  const std::string longline(3 << 20, 'x');
  const std::string content = "1 2\r\n3 4\n\n" + longline + "\n5 6\r\nlast";
  const std::vector<std::string> want = {"1 2", "3 4", "", longline, "5 6", "last"};
  write_file(tmp / "in.txt", content);
  write_gzip(tmp / "in.gz", content);
  write_xz(tmp / "in.xz", content);
  // Two gzip members back to back decode as their concatenation.
  write_gzip(tmp / "two.gz", std::vector<std::string>{content.substr(0, 7), content.substr(7)});
  for (const auto& [file, kind] : std::vector<std::pair<std::string, std::string>>{
           {"in.txt", "none"}, {"in.gz", "gzip"}, {"in.xz", "xz"}, {"two.gz", "gzip"}}) {
    TextInput in(tmp / file);
    EXPECT_EQ(std::string(in.compression()), kind) << file;
    EXPECT_EQ(all_lines(in), want) << file;
    EXPECT_EQ(in.line_number(), 6) << file;
    EXPECT_EQ(in.sha256_hex(), sha(content)) << file;
    EXPECT_EQ(in.compressed_position(), in.file_size()) << file;
  }
}

TEST(TextInput, GzipZeroPaddingIsIgnoredOtherTrailingBytesAreNot) {
  TempDir tmp;
  write_gzip(tmp / "a.gz", "x 1\ny 2\n");
  write_file(tmp / "padded.gz", read_file(tmp / "a.gz") + std::string(512, '\0'));
  TextInput padded(tmp / "padded.gz");
  EXPECT_EQ(all_lines(padded), (std::vector<std::string>{"x 1", "y 2"}));
  write_file(tmp / "junk.gz", read_file(tmp / "a.gz") + "junk");
  expect_error([&] {
    TextInput junk(tmp / "junk.gz");
    all_lines(junk);
  }, {"junk.gz", "trailing garbage"});
}

TEST(TextInput, TrailingNewlineAddsNoLine) {
  TempDir tmp;
  write_file(tmp / "a.txt", "a\nb\n");
  TextInput in(tmp / "a.txt");
  EXPECT_EQ(all_lines(in), (std::vector<std::string>{"a", "b"}));
}

TEST(TextInput, ErrorsNameTheFile) {
  TempDir tmp;
  expect_error([&] { TextInput in(tmp / "nope.txt"); }, {"nope.txt", "cannot open"});
  const std::string content(200000, 'z');
  write_xz(tmp / "full.xz", content);
  const std::string xz = read_file(tmp / "full.xz");
  write_file(tmp / "cut.xz", xz.substr(0, xz.size() / 2));
  expect_error([&] {
    TextInput in(tmp / "cut.xz");
    all_lines(in);
  }, {"cut.xz", "xz"});
  write_gzip(tmp / "full.gz", content + "\nmore text to compress " + std::string(1000, 'q'));
  const std::string gz = read_file(tmp / "full.gz");
  write_file(tmp / "cut.gz", gz.substr(0, gz.size() - 12));
  expect_error([&] {
    TextInput in(tmp / "cut.gz");
    all_lines(in);
  }, {"cut.gz", "gzip"});
}

TEST(SplitFields, DelimitersTrimAndCount) {
  std::string_view f[4];
  EXPECT_EQ(split_fields("  1 \t 2 ", Delimiter::kWhitespace, ' ', f, 3), 2u);
  EXPECT_EQ(f[0], "1");
  EXPECT_EQ(f[1], "2");
  EXPECT_EQ(split_fields("1::2::5::978300760", Delimiter::kDoubleColon, ':', f, 3), 4u);  // one beyond: too many
  EXPECT_EQ(split_fields("1::2::5::978300760", Delimiter::kDoubleColon, ':', f, 4), 4u);
  EXPECT_EQ(f[3], "978300760");
  EXPECT_EQ(split_fields("a, b ,,c", Delimiter::kChar, ',', f, 4), 4u);
  EXPECT_EQ(f[1], "b");
  EXPECT_EQ(f[2], "");
  EXPECT_EQ(split_fields("", Delimiter::kChar, ',', f, 3), 1u);
}

TEST(IdTable, IntegersInFirstAppearanceOrder) {
  IdTable t;
  EXPECT_EQ(t.index_of(int64_t{42}), 0);
  EXPECT_EQ(t.index_of(int64_t{-7}), 1);
  EXPECT_EQ(t.index_of(int64_t{42}), 0);
  for (int64_t i = 0; i < 5000; ++i) EXPECT_EQ(t.index_of(i * 1000003), i + 2) << i;
  EXPECT_EQ(t.size(), 5002);
  EXPECT_TRUE(t.numeric());
  EXPECT_TRUE(t.less(1, 0));
}

TEST(IdTable, SwitchesToStringsKeepingIndices) {
  IdTable t(/*allow_strings=*/true);
  EXPECT_EQ(t.index_of(std::string_view("10")), 0);
  EXPECT_EQ(t.index_of(std::string_view("9")), 1);
  EXPECT_TRUE(t.numeric());
  EXPECT_TRUE(t.less(1, 0));  // numeric order while all ids are integers
  EXPECT_EQ(t.index_of(std::string_view("007")), 2);  // not canonical: a string, not 7
  EXPECT_FALSE(t.numeric());
  EXPECT_EQ(t.index_of(std::string_view("10")), 0);
  EXPECT_EQ(t.index_of(std::string_view("7")), 3);
  EXPECT_EQ(t.text(2), "007");
  EXPECT_TRUE(t.less(0, 1));  // bytewise now: "10" < "9"
}

TEST(CanonicalId, IntegersByValue) {
  EXPECT_EQ(canonical_id(" 0042 "), "42");
  EXPECT_EQ(canonical_id("abc"), "abc");
}

}  // namespace
