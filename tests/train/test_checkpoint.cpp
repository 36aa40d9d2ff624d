// Checkpoint files and directories: round trips, every kind of damage named, atomic
// commit, pruning, and incomplete directories never taken for complete ones.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "dist/comm.h"
#include "io/remove_tree.h"
#include "train/checkpoint.h"
#include "tests/test_files.h"

namespace {
namespace fs = std::filesystem;
using namespace seqrec::train;

// A fresh scratch directory, removed with everything in it when the test ends.
struct Scratch {
  explicit Scratch(const std::string& name)
      : path((fs::temp_directory_path() / ("seqrec-ckpt-" + name + "-" + std::to_string(::getpid()))).string()) {
    seqrec::io::remove_tree(path);
    fs::create_directories(path);
  }
  ~Scratch() { seqrec::io::try_remove_tree(path); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  operator const std::string&() const { return path; }
  std::string operator+(const char* rel) const { return path + rel; }
  const std::string path;
};

TensorBundle sample_bundle() {
  TensorBundle b;
  b.meta["step"] = "12";
  b.meta["binary"] = std::string("a\0b\n\xff", 5);
  b.tensors.emplace_back("f32", torch::arange(12, torch::kFloat32).view({3, 4}));
  b.tensors.emplace_back("f64", torch::tensor({1.5, -2.25}, torch::kFloat64));
  b.tensors.emplace_back("i64", torch::tensor({int64_t{1} << 40}, torch::kInt64));
  b.tensors.emplace_back("i32", torch::tensor({-7}, torch::kInt32));
  b.tensors.emplace_back("u8", torch::tensor({255}, torch::kUInt8));
  b.tensors.emplace_back("bool", torch::tensor({true, false}));
  b.tensors.emplace_back("f16", torch::ones({2}, torch::kFloat16));
  b.tensors.emplace_back("bf16", torch::ones({2}, torch::kBFloat16));
  b.tensors.emplace_back("scalar", torch::tensor(3.0f));
  b.tensors.emplace_back("empty", torch::zeros({0, 5}));
  b.tensors.emplace_back("strided", torch::arange(20, torch::kFloat32).view({4, 5}).t());
  return b;
}

void expect_error_naming(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error (expected one naming '" << needle << "')";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(BundleFile, RoundTripsEveryDtypeAndShape) {
  const Scratch dir("roundtrip");
  auto b = sample_bundle();
  write_bundle_file(dir + "/x.bin", b);
  auto r = read_bundle_file(dir + "/x.bin");
  EXPECT_EQ(r.meta, b.meta);
  ASSERT_EQ(r.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < b.tensors.size(); ++i) {
    EXPECT_EQ(r.tensors[i].first, b.tensors[i].first);
    EXPECT_EQ(r.tensors[i].second.scalar_type(), b.tensors[i].second.scalar_type());
    EXPECT_TRUE(torch::equal(r.tensors[i].second, b.tensors[i].second)) << b.tensors[i].first;
  }
}

TEST(BundleFile, EveryTruncationIsAClearError) {
  const Scratch dir("trunc");
  write_bundle_file(dir + "/x.bin", sample_bundle());
  const std::string bytes = seqrec::testing::read_file(dir + "/x.bin");
  for (size_t cut = 0; cut < bytes.size(); cut += std::max<size_t>(1, bytes.size() / 40)) {
    std::ofstream(dir + "/t.bin", std::ios::binary).write(bytes.data(), cut);
    expect_error_naming([&] { read_bundle_file(dir + "/t.bin"); }, "t.bin");
  }
}

TEST(BundleFile, FlippedBytesBadMagicAndMissingFilesAreNamed) {
  const Scratch dir("flip");
  write_bundle_file(dir + "/x.bin", sample_bundle());
  std::fstream f(dir + "/x.bin", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(300);
  f.put('\x7f');
  f.close();
  expect_error_naming([&] { read_bundle_file(dir + "/x.bin"); }, "checksum mismatch");
  std::ofstream(dir + "/junk.bin") << "definitely not a checkpoint file at all";
  expect_error_naming([&] { read_bundle_file(dir + "/junk.bin"); }, "bad magic");
  expect_error_naming([&] { read_bundle_file(dir + "/missing.bin"); }, "missing.bin");
}

TEST(CheckpointManager, SaveLatestLoadAndPrune) {
  const Scratch dir("manager");
  auto comm = seqrec::dist::make_local_comm();
  CheckpointManager m({dir, 2}, *comm);
  EXPECT_FALSE(m.latest().has_value());
  for (int64_t step : {5, 10, 15}) {
    TensorBundle s;
    s.meta["step"] = std::to_string(step);
    s.tensors.emplace_back("w", torch::full({3}, static_cast<float>(step)));
    TensorBundle r;
    r.tensors.emplace_back("rng", torch::tensor({step}));
    m.save(step, s, r);
  }
  auto latest = m.latest();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(*latest).filename(), "step-000000000015");
  EXPECT_FALSE(fs::exists(dir + "/step-000000000005")) << "keep_last 2 prunes the oldest";
  EXPECT_TRUE(fs::exists(dir + "/step-000000000010"));
  auto loaded = m.load(*latest);
  EXPECT_EQ(loaded.shared.value("step"), "15");
  ASSERT_TRUE(loaded.per_rank.has_value());
  EXPECT_EQ(loaded.per_rank->tensor("rng").item<int64_t>(), 15);
  EXPECT_EQ(loaded.saved_world_size, 1);
}

TEST(CheckpointManager, IncompleteAndDamagedCheckpointsAreNeverTakenForComplete) {
  const Scratch dir("incomplete");
  auto comm = seqrec::dist::make_local_comm();
  CheckpointManager m({dir, 5}, *comm);
  TensorBundle s;
  s.tensors.emplace_back("w", torch::ones({1000}));
  const std::string good = m.save(1, s, {});
  // A crash before the marker: a newer directory without COMPLETE, and a leftover temp dir.
  const std::string partial = m.save(2, s, {});
  fs::remove(partial + "/COMPLETE");
  fs::create_directories(dir + "/.tmp-step-000000000003");
  EXPECT_EQ(*m.latest(), good);
  expect_error_naming([&] { m.load(partial); }, "COMPLETE");
  // A truncated file in a complete-looking checkpoint: latest() skips it, load() names it.
  const std::string damaged = m.save(4, s, {});
  fs::resize_file(damaged + "/shared.bin", 64);
  EXPECT_EQ(*m.latest(), good);
  expect_error_naming([&] { m.load(damaged); }, "shared.bin");
  // Same size, different bytes: only the checksum catches it.
  const std::string flipped = m.save(5, s, {});
  {
    std::fstream f(flipped + "/shared.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x01');
  }
  expect_error_naming([&] { m.load(flipped); }, "checksum");
  EXPECT_EQ(*m.latest(), good) << "a damaged newest checkpoint falls back to the last good one";
  expect_error_naming([&] { verify_checkpoint(flipped); }, "shared.bin");
  // A new save after all that succeeds and becomes the latest.
  const std::string next = m.save(6, s, {});
  EXPECT_EQ(*m.latest(), next);
  EXPECT_FALSE(fs::exists(dir + "/.tmp-step-000000000003")) << "stale temporaries are cleaned";
}

}  // namespace
