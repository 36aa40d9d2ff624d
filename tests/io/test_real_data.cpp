// The real public files in shared/data (see its README for their provenance and figures).
// Skipped, with a message, where the folder is absent.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "io/text_input.h"
#include "io_test_util.h"

namespace {
using namespace seqrec::io;
using namespace seqrec::testing;

std::string data_file(const std::string& rel) { return shared_data_dir() + "/" + rel; }

#define REQUIRE_DATA(path)                                                                              \
  if (!fs::exists(path))                                                                                \
  GTEST_SKIP() << "real data file not found: " << (path)                                                \
               << " (set SEQREC_SHARED_DATA to the shared/data folder to run this test)"

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(RealData, Ml1mSasrec) {
  const std::string in = data_file("ml-1m/sasrec/ml-1m.txt.xz");
  REQUIRE_DATA(in);
  TempDir tmp;
  auto o = prepare_options("sasrec", in, tmp / "ml-1m");
  o.shards = 4;
  const auto t0 = std::chrono::steady_clock::now();
  const auto meta = prepare_dataset(o);
  const double s = seconds_since(t0);
  std::printf("prepare ml-1m.txt.xz: %.2f s\n", s);
  RecordProperty("prepare_seconds", std::to_string(s));
  EXPECT_EQ(meta.name, "ml-1m");
  EXPECT_EQ(meta.num_users, 6040);
  EXPECT_EQ(meta.num_items, 3416);
  EXPECT_EQ(meta.num_events, 999611);
  EXPECT_EQ(meta.source_checksum, "b725f3acb3986fe3130bffd1e77a74d182a1f51799567a236dbd60270f95b0a2");
  EXPECT_NEAR(std::stod(meta.attributes.at("seq_len_mean")), 999611.0 / 6040, 1e-3);  // README: 165.50
  EXPECT_LT(s, 10.0);

  // User 1's items, in the order the file lists them.
  std::vector<int32_t> want;
  TextInput text(in);
  std::string_view line;
  while (text.next_line(line) && line.substr(0, 2) == "1 ") want.push_back(std::stoi(std::string(line.substr(2))));
  ASSERT_GT(want.size(), 10u);
  const auto first = load_shards(tmp / "ml-1m", meta, 0, 4);
  ASSERT_EQ(first.user_begin, 0);
  ASSERT_EQ(first.length(0), static_cast<int64_t>(want.size()));
  // The file's ids are already dense, so dense ids (raw-id order) equal them.
  EXPECT_EQ(std::vector<int32_t>(first.items_of(0), first.items_of(0) + first.length(0)), want);
  EXPECT_EQ(read_raw_ids(tmp / "ml-1m", "user").front(), "1");
}

TEST(RealData, Ml1mSasrecWithUserFeatures) {
  const std::string in = data_file("ml-1m/sasrec/ml-1m.txt.xz");
  REQUIRE_DATA(in);
  REQUIRE_DATA(data_file("ml-1m/users.dat"));
  TempDir tmp;
  auto o = prepare_options("sasrec", in, tmp / "ds");
  o.user_features = data_file("ml-1m/users.dat");
  o.user_id_map = data_file("ml-1m/sasrec/sas_to_original_users.txt");
  const auto meta = prepare_dataset(o);
  EXPECT_EQ(meta.user_feature_cardinalities, (std::vector<int64_t>{2, 7, 21, 10}));
  EXPECT_EQ(meta.attributes.at("users_without_features"), "0");
  const auto seqs = load_shards(tmp / "ds", meta, 0, 1);
  // users.dat: 4,331 M and 1,709 F; ages 1:222 ... 56:380 (codes in sorted order: F=1, M=2).
  int64_t male = 0, age1 = 0, age56 = 0;
  for (int64_t u = 0; u < meta.num_users; ++u) {
    male += seqs.user_features[u * 4] == 2;
    age1 += seqs.user_features[u * 4 + 1] == 1;
    age56 += seqs.user_features[u * 4 + 1] == 7;
  }
  EXPECT_EQ(male, 4331);
  EXPECT_EQ(age1, 222);
  EXPECT_EQ(age56, 380);
}

TEST(RealData, Ml1mRatingsHead) {
  const std::string in = data_file("ml-1m/ratings.head487650.dat.xz");
  REQUIRE_DATA(in);
  TempDir tmp;
  const auto meta = prepare_dataset(prepare_options("ml-1m", in, tmp / "ds"));
  EXPECT_EQ(meta.num_events, 487650);
  EXPECT_EQ(meta.num_users, 2999);
  EXPECT_EQ(meta.num_items, 3615);
  EXPECT_EQ(meta.source_checksum, "1273c4edfe3c0ff9e3a0a0d55819faeb947da0ad7df3927333b51ebefbeedc3d");
  EXPECT_EQ(meta.attributes.at("time_min"), "970620734");
  EXPECT_EQ(meta.attributes.at("time_max"), "1046388675");
  const auto seqs = load_shards(tmp / "ds", meta, 0, 1);
  for (int64_t u = 0; u < meta.num_users; ++u) {
    const int64_t b = seqs.offsets[u], e = seqs.offsets[u + 1];
    ASSERT_TRUE(std::is_sorted(seqs.timestamps.begin() + b, seqs.timestamps.begin() + e)) << "user " << u;
  }
}

TEST(RealData, TaobaoHead) {
  const std::string in = data_file("taobao-userbehavior/UserBehavior.head84475.csv.xz");
  REQUIRE_DATA(in);
  TempDir tmp;
  const auto all = prepare_dataset(prepare_options("taobao", in, tmp / "all"));
  EXPECT_EQ(all.num_users, 815);
  EXPECT_EQ(all.num_items, 55368);
  EXPECT_EQ(all.num_events, 84475);
  EXPECT_EQ(all.attributes.at("rows_pv"), "75872");
  EXPECT_EQ(all.attributes.at("rows_cart"), "4497");
  EXPECT_EQ(all.attributes.at("rows_fav"), "2356");
  EXPECT_EQ(all.attributes.at("rows_buy"), "1750");
  EXPECT_EQ(all.attributes.at("time_min"), "1505117799");
  EXPECT_EQ(all.attributes.at("time_max"), "1512316763");
  EXPECT_EQ(all.source_checksum, "e3013a3a225cf384b66dbbd7557f50829f28bd0de2555e31604eef6891ffa0c7");
  auto o = prepare_options("taobao", in, tmp / "pv");
  o.behaviors = {"pv"};
  const auto pv = prepare_dataset(o);
  EXPECT_EQ(pv.num_events, 75872);
  EXPECT_LE(pv.num_users, 815);
  // The file lists users in string order (1, 100, 1000, ...); dense users follow numeric order.
  const auto users = read_raw_ids(tmp / "all", "user");
  EXPECT_EQ(users.front(), "1");
  EXPECT_TRUE(std::is_sorted(users.begin(), users.end(),
                             [](const std::string& a, const std::string& b) { return std::stoll(a) < std::stoll(b); }));
}

}  // namespace
