// The dataset directory as a reader sees it: any world size over any shard count, and every
// kind of damage turned into a std::runtime_error that names the file.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <memory>

#include "io/format.h"
#include "io_test_util.h"

namespace {
using namespace seqrec::io;
using namespace seqrec::testing;

// A 4-shard and a 2-shard preparation of the same data, with timestamps and user features.
class Shards : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    std::string ratings, users;
    for (int u = 1; u <= 61; ++u) {
      users += std::to_string(u) + "::" + (u % 3 ? "M" : "F") + "::" + std::to_string(18 + u % 4) + "::" +
               std::to_string(u % 5) + "::" + std::to_string(10000 + u * 7) + "\n";
      for (int j = 0; j < 2 + (u * 7) % 23; ++j)
        ratings += std::to_string(u) + "::" + std::to_string(1 + (u * 17 + j * 5) % 53) + "::" + std::to_string(1 + j % 5) +
                   "::" + std::to_string(1000000 - j * 10 + u) + "\n";
    }
    write_file(*dir_ / "ratings.dat", ratings);
    write_file(*dir_ / "users.dat", users);
    for (int shards : {4, 2}) {
      auto o = prepare_options("ml-1m", *dir_ / "ratings.dat", *dir_ / ("s" + std::to_string(shards)));
      o.shards = shards;
      o.user_features = *dir_ / "users.dat";
      prepare_dataset(o);
    }
  }
  static void TearDownTestSuite() { dir_.reset(); }

  // A private copy of a prepared dataset to damage.
  std::string copy(const std::string& which) {
    const std::string to = tmp_ / which;
    fs::copy(*dir_ / which, to, fs::copy_options::recursive);
    return to;
  }
  static std::string src(const std::string& which) { return *dir_ / which; }

  TempDir tmp_;
  static std::unique_ptr<TempDir> dir_;
};
std::unique_ptr<TempDir> Shards::dir_;

void set_root_int_attr(const std::string& file, const char* name, int64_t value) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << file;
  hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  ASSERT_GE(a, 0) << name;
  EXPECT_GE(H5Awrite(a, H5T_NATIVE_INT64, &value), 0);
  H5Aclose(a);
  H5Fclose(f);
}

// Reads a whole 1-d dataset, lets `edit` change it, writes it back.
template <typename T>
void edit_dataset(const std::string& file, const char* name, const std::function<void(std::vector<T>&)>& edit) {
  const hid_t mem = sizeof(T) == 4 ? H5T_NATIVE_INT32 : H5T_NATIVE_INT64;
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << file;
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  hid_t s = H5Dget_space(d);
  std::vector<T> v(H5Sget_simple_extent_npoints(s));
  ASSERT_GE(H5Dread(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
  edit(v);
  ASSERT_GE(H5Dwrite(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
  H5Sclose(s);
  H5Dclose(d);
  H5Fclose(f);
}

// File offset of a contiguous dataset's values.
haddr_t data_offset(const std::string& file, const char* name) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  const haddr_t at = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  return at;
}

void flip_byte(const std::string& file, uint64_t at, uint8_t mask) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c;
  f.get(c);
  c ^= static_cast<char>(mask);
  f.seekp(at);
  f.put(c);
}

TEST(OwnedShards, ContiguousBlocks) {
  EXPECT_EQ(owned_shards(4, 0, 1), (std::pair<int64_t, int64_t>{0, 4}));
  EXPECT_EQ(owned_shards(4, 1, 2), (std::pair<int64_t, int64_t>{2, 4}));
  EXPECT_EQ(owned_shards(4, 0, 3), (std::pair<int64_t, int64_t>{0, 1}));
  EXPECT_EQ(owned_shards(4, 2, 3), (std::pair<int64_t, int64_t>{2, 4}));
  EXPECT_EQ(owned_shards(4, 0, 5), (std::pair<int64_t, int64_t>{0, 0}));  // owns none
  EXPECT_EQ(owned_shards(4, 4, 5), (std::pair<int64_t, int64_t>{3, 4}));
  EXPECT_THROW(owned_shards(4, 5, 5), std::invalid_argument);
  EXPECT_THROW(owned_shards(4, 0, 0), std::invalid_argument);
}

TEST_F(Shards, EveryWorldSizeCoversEveryUserOnce) {
  const auto meta = read_meta(src("s4"));
  ASSERT_EQ(meta.num_shards, 4);
  const auto all = load_shards(src("s4"), meta, 0, 1);
  ASSERT_EQ(all.num_users(), meta.num_users);
  ASSERT_EQ(static_cast<int64_t>(all.items.size()), meta.num_events);
  ASSERT_EQ(all.timestamps.size(), all.items.size());
  ASSERT_EQ(static_cast<int64_t>(all.user_features.size()), meta.num_users * 4);
  for (int world : {1, 2, 3, 5}) {
    int64_t next_user = 0;
    int empty_ranks = 0;
    for (int rank = 0; rank < world; ++rank) {
      const auto part = load_shards(src("s4"), meta, rank, world);
      EXPECT_EQ(part.user_begin, next_user) << "world " << world << " rank " << rank;
      next_user = part.user_end;
      empty_ranks += part.num_users() == 0;
      ASSERT_EQ(static_cast<int64_t>(part.offsets.size()), part.num_users() + 1);
      for (int64_t u = part.user_begin; u < part.user_end; ++u) {
        ASSERT_EQ(part.length(u), all.length(u)) << "user " << u;
        EXPECT_TRUE(std::equal(part.items_of(u), part.items_of(u) + part.length(u), all.items_of(u))) << "user " << u;
        const int64_t a = part.offsets[u - part.user_begin], b = all.offsets[u];
        EXPECT_TRUE(std::equal(part.timestamps.begin() + a, part.timestamps.begin() + a + part.length(u),
                               all.timestamps.begin() + b));
        for (int k = 0; k < 4; ++k)
          EXPECT_EQ(part.user_features[(u - part.user_begin) * 4 + k], all.user_features[u * 4 + k]);
      }
    }
    EXPECT_EQ(next_user, meta.num_users) << "world " << world;
    EXPECT_EQ(empty_ranks, world == 5 ? 1 : 0) << "world " << world;
  }
  // The 2-shard copy holds the same data.
  const auto two = read_meta(src("s2"));
  const auto all2 = load_shards(src("s2"), two, 0, 1);
  EXPECT_EQ(all2.items, all.items);
  EXPECT_EQ(all2.offsets, all.offsets);
  EXPECT_EQ(all2.user_features, all.user_features);
}

TEST_F(Shards, EmptyRankGetsTheNextShardsBegin) {
  const auto meta = read_meta(src("s4"));
  const auto none = load_shards(src("s4"), meta, 0, 5);
  EXPECT_EQ(none.user_begin, meta.shard_user_begin[0]);
  EXPECT_EQ(none.user_end, none.user_begin);
  EXPECT_EQ(none.offsets, (std::vector<int64_t>{0}));
  EXPECT_TRUE(none.items.empty());
  EXPECT_THROW(load_shards(src("s4"), meta, 5, 5), std::invalid_argument);
  DatasetMeta bare = meta;
  bare.shard_checksums.clear();
  EXPECT_THROW(load_shards(src("s4"), bare, 0, 1), std::invalid_argument);
}

TEST_F(Shards, MissingMetaOrShard) {
  expect_error([&] { read_meta(tmp_ / "nowhere"); }, {"nowhere", "no such dataset directory"});
  fs::create_directories(tmp_ / "empty");
  expect_error([&] { read_meta(tmp_ / "empty"); }, {"empty/meta.h5", "missing"});
  const std::string d = copy("s4");
  fs::remove(d + "/shard-00002-of-00004.h5");
  const auto meta = read_meta(d);
  expect_error([&] { load_shards(d, meta, 0, 1); }, {"shard-00002-of-00004.h5", "missing"});
  EXPECT_NO_THROW(load_shards(d, meta, 0, 4)) << "a rank reads only its own shards";
}

TEST_F(Shards, NotHdf5) {
  const std::string d = copy("s4");
  write_file(d + "/shard-00001-of-00004.h5", "user item\n1 2\n");
  const auto meta = read_meta(d);
  expect_error([&] { load_shards(d, meta, 0, 1); }, {"shard-00001-of-00004.h5", "not an HDF5 file"});
  write_file(d + "/meta.h5", "");
  expect_error([&] { read_meta(d); }, {"meta.h5", "not an HDF5 file"});
}

TEST_F(Shards, TruncatedFiles) {
  const std::string d = copy("s4");
  const auto meta = read_meta(d);
  const std::string shard = d + "/shard-00003-of-00004.h5";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  expect_error([&] { load_shards(d, meta, 0, 1); }, {"shard-00003-of-00004.h5"});
  fs::resize_file(d + "/meta.h5", fs::file_size(d + "/meta.h5") - 100);
  expect_error([&] { read_meta(d); }, {"meta.h5"});
}

TEST_F(Shards, BitFlipIsCaughtByTheChecksum) {
  const std::string d = copy("s4");
  const auto meta = read_meta(d);
  const std::string shard = d + "/shard-00001-of-00004.h5";
  // Flip bit 0 of an item whose neighbour id is still in range, so only the checksum can
  // tell (items are int32 little-endian: byte 0 is the low byte).
  const auto part = load_shards(d, meta, 1, 4);
  size_t j = 0;
  while (j < part.items.size() && !((part.items[j] ^ 1) >= 1 && (part.items[j] ^ 1) <= meta.num_items)) ++j;
  ASSERT_LT(j, part.items.size());
  const haddr_t at = data_offset(shard, "items");
  ASSERT_NE(at, HADDR_UNDEF) << "items must be stored contiguously";
  flip_byte(shard, at + 4 * j, 0x01);
  expect_error([&] { load_shards(d, meta, 1, 4); }, {"shard-00001-of-00004.h5", "checksum mismatch"});
  flip_byte(shard, at + 4 * j, 0x01);
  EXPECT_NO_THROW(load_shards(d, meta, 1, 4));
  flip_byte(shard, data_offset(shard, "timestamps") + 8 * 3 + 2, 0x10);
  expect_error([&] { load_shards(d, meta, 1, 4); }, {"shard-00001-of-00004.h5", "checksum mismatch"});
}

TEST_F(Shards, ShardCountMismatch) {
  const std::string d = copy("s4");
  fs::copy_file(src("s2") + "/shard-00000-of-00002.h5", d + "/shard-00000-of-00004.h5",
                fs::copy_options::overwrite_existing);
  const auto meta = read_meta(d);
  expect_error([&] { load_shards(d, meta, 0, 1); },
               {"shard-00000-of-00004.h5", "shard-count mismatch", "shard 0 of 2", "shard 0 of 4"});
  const std::string e = copy("s2");
  set_root_int_attr(e + "/shard-00001-of-00002.h5", "shard_index", 0);
  expect_error([&] { load_shards(e, read_meta(e), 0, 1); }, {"shard-00001-of-00002.h5", "shard-count mismatch"});
}

TEST_F(Shards, FormatVersionMismatch) {
  const std::string d = copy("s4");
  set_root_int_attr(d + "/meta.h5", "format_version", kFormatVersion + 1);
  expect_error([&] { read_meta(d); }, {"meta.h5", "format version mismatch", "version " + std::to_string(kFormatVersion + 1)});
  const std::string e = copy("s2");
  set_root_int_attr(e + "/shard-00001-of-00002.h5", "format_version", 0);
  expect_error([&] { load_shards(e, read_meta(e), 0, 1); }, {"shard-00001-of-00002.h5", "format version mismatch"});
}

TEST_F(Shards, ItemIdsOutOfRange) {
  const auto meta = read_meta(src("s2"));
  for (int32_t bad : {0, static_cast<int32_t>(meta.num_items + 1), -5}) {
    const std::string d = tmp_ / ("bad" + std::to_string(bad));
    fs::copy(src("s2"), d, fs::copy_options::recursive);
    edit_dataset<int32_t>(d + "/shard-00000-of-00002.h5", "items", [&](std::vector<int32_t>& v) { v[5] = bad; });
    expect_error([&] { load_shards(d, meta, 0, 1); },
                 {"shard-00000-of-00002.h5", "item id " + std::to_string(bad) + " out of range [1, " +
                                                 std::to_string(meta.num_items) + "]"});
  }
}

TEST_F(Shards, OffsetsNotMonotone) {
  const std::string d = copy("s2");
  const auto meta = read_meta(d);
  edit_dataset<int64_t>(d + "/shard-00001-of-00002.h5", "offsets", [](std::vector<int64_t>& v) { std::swap(v[2], v[3]); });
  expect_error([&] { load_shards(d, meta, 0, 1); }, {"shard-00001-of-00002.h5", "not monotone"});
  edit_dataset<int64_t>(d + "/shard-00001-of-00002.h5", "offsets", [](std::vector<int64_t>& v) {
    std::swap(v[2], v[3]);
    v[0] = 1;
  });
  expect_error([&] { load_shards(d, meta, 0, 1); }, {"shard-00001-of-00002.h5", "start at 0"});
}

TEST_F(Shards, InconsistentMetaCounts) {
  const std::string d = copy("s2");
  set_root_int_attr(d + "/meta.h5", "num_users", 7);
  expect_error([&] { read_meta(d); }, {"meta.h5", "shard_user_begin"});
  const std::string e = copy("s4");
  set_root_int_attr(e + "/meta.h5", "num_shards", 3);
  expect_error([&] { read_meta(e); }, {"meta.h5", "num_shards = 3"});
}

TEST_F(Shards, MetaHoldsTheContract) {
  const auto meta = read_meta(src("s4"));
  EXPECT_EQ(meta.source_format, "ml-1m");
  EXPECT_EQ(meta.name, "ratings");
  EXPECT_TRUE(meta.has_timestamps);
  EXPECT_EQ(meta.user_feature_names.size(), 4u);
  for (const char* k : {"seq_len_min", "seq_len_median", "seq_len_mean", "seq_len_max", "density", "rows_read", "split"})
    EXPECT_TRUE(meta.attributes.count(k)) << k;
  EXPECT_EQ(static_cast<int64_t>(read_raw_ids(src("s4"), "user").size()), meta.num_users);
  EXPECT_EQ(static_cast<int64_t>(read_raw_ids(src("s4"), "item").size()), meta.num_items);
  EXPECT_THROW(read_raw_ids(src("s4"), "movie"), std::invalid_argument);
  const std::string d = describe(meta);
  for (const char* part : {"dataset 'ratings'", "gender (2 values)", "shards: 4", "source sha256"})
    EXPECT_NE(d.find(part), std::string::npos) << part << " not in\n" << d;
}

TEST_F(Shards, H5dumpReadsEverything) {
  if (std::system("h5dump --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "h5dump (hdf5-tools) is not installed";
  for (const std::string f : {"meta.h5", "shard-00000-of-00004.h5"}) {
    const std::string cmd = "h5dump " + src("s4") + "/" + f + " > " + tmp_ / "dump.txt" + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << read_file(tmp_ / "dump.txt");
  }
  const std::string dump = read_file(tmp_ / "dump.txt");
  for (const char* part : {"\"offsets\"", "\"items\"", "\"timestamps\"", "\"user_features\"", "\"shard_index\""})
    EXPECT_NE(dump.find(part), std::string::npos) << part;
}

}  // namespace
