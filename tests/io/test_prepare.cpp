// prepare_dataset on small hand-made inputs: every format, compression, ordering, filters,
// features, the atomic write, and every kind of bad input with the message checked.
#include <gtest/gtest.h>
#include <hdf5.h>

#include "io/build_info.h"
#include "io/writer.h"
#include "io_test_util.h"

namespace {
using namespace seqrec::io;
using namespace seqrec::testing;
using Seqs = std::map<std::string, std::vector<std::string>>;

// No "<out>.tmp-*" directory may survive a prepare, failed or not.
void expect_no_temp_dirs(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST(Prepare, SasrecKeepsFileOrderAndRawIds) {
  TempDir tmp;
  write_file(tmp / "toy.txt", "1 10\n1 12\n2 12\n1 11\n3 10\n2 13\n");
  const auto meta = prepare_dataset(prepare_options("sasrec", tmp / "toy.txt", tmp / "ds"));
  EXPECT_EQ(meta.name, "toy");
  EXPECT_EQ(meta.source_format, "sasrec");
  EXPECT_EQ(meta.num_users, 3);
  EXPECT_EQ(meta.num_items, 4);
  EXPECT_EQ(meta.num_events, 6);
  EXPECT_FALSE(meta.has_timestamps);
  EXPECT_EQ(meta.format_version, kFormatVersion);
  EXPECT_EQ(meta.source_checksum.size(), 64u);
  EXPECT_EQ(raw_sequences(tmp / "ds"), (Seqs{{"1", {"10", "12", "11"}}, {"2", {"12", "13"}}, {"3", {"10"}}}));
  // Dense ids follow the raw ids' order: items 10..13 -> 1..4, users 1..3 -> 0..2.
  const auto seqs = load_shards(tmp / "ds", meta, 0, 1);
  EXPECT_EQ(seqs.offsets, (std::vector<int64_t>{0, 3, 5, 6}));
  EXPECT_EQ(seqs.items, (std::vector<int32_t>{1, 3, 2, 3, 4, 1}));
  EXPECT_TRUE(seqs.timestamps.empty());
  EXPECT_EQ(meta.attributes.at("seq_len_max"), "3");
  EXPECT_EQ(meta.attributes.at("seq_len_median"), "2");
  EXPECT_EQ(meta.attributes.at("rows_read"), "6");
  // Which build wrote the dataset, as meta.h5 keeps it.
  EXPECT_EQ(read_meta(tmp / "ds").attributes.at("created_by"), "seqrec prepare, " + describe_build());
  const std::string d = describe(meta);
  EXPECT_NE(d.find("users 3, items 4"), std::string::npos) << d;
  EXPECT_NE(d.find("events 6"), std::string::npos) << d;
  expect_no_temp_dirs(tmp.path());
}

TEST(Prepare, GzipAndXzInputsGiveTheSameDataset) {
  TempDir tmp;
  std::string content;
  for (int u = 1; u <= 50; ++u)
    for (int j = 0; j < 3 + u % 7; ++j) content += std::to_string(u) + " " + std::to_string(1 + (u * 31 + j * 17) % 40) + "\r\n";
  write_file(tmp / "d.txt", content);
  write_gzip(tmp / "d.txt.gz", content);
  write_xz(tmp / "d.txt.xz", content);
  const auto plain = prepare_dataset(prepare_options("sasrec", tmp / "d.txt", tmp / "plain"));
  for (const std::string f : {"d.txt.gz", "d.txt.xz"}) {
    const auto m = prepare_dataset(prepare_options("sasrec", tmp / f, tmp / (f + ".ds")));
    EXPECT_EQ(m.name, "d") << f;
    EXPECT_EQ(m.source_checksum, plain.source_checksum) << f << ": the checksum is of the decompressed bytes";
    EXPECT_EQ(m.shard_checksums, plain.shard_checksums) << f;
    EXPECT_EQ(raw_sequences(tmp / (f + ".ds")), raw_sequences(tmp / "plain")) << f;
  }
}

TEST(Prepare, Ml1mChronologicalWithStableTies) {
  TempDir tmp;
  // User 1: times 300, 100, 100, 200, 100 -> the three 100s keep file order (11, 12, 14).
  write_file(tmp / "ratings.dat",
             "1::10::5::300\n1::11::3::100\n2::10::4::50\n1::12::4::100\n1::13::1::200\n1::14::2::100\n"
             "2::11::5::50\n2::12::5::40\n");
  const auto meta = prepare_dataset(prepare_options("ml-1m", tmp / "ratings.dat", tmp / "ds"));
  EXPECT_TRUE(meta.has_timestamps);
  EXPECT_EQ(raw_sequences(tmp / "ds"), (Seqs{{"1", {"11", "12", "14", "13", "10"}}, {"2", {"12", "10", "11"}}}));
  const auto seqs = load_shards(tmp / "ds", meta, 0, 1);
  EXPECT_EQ(seqs.timestamps, (std::vector<int64_t>{100, 100, 100, 200, 300, 40, 50, 50}));
  EXPECT_EQ(meta.attributes.at("time_min"), "40");
  EXPECT_EQ(meta.attributes.at("time_max"), "300");
}

TEST(Prepare, RatingThreshold) {
  TempDir tmp;
  write_file(tmp / "ratings.dat", "1::10::5::300\n1::11::3::100\n1::12::4::100\n2::13::1::1\n3::10::4::7\n");
  auto o = prepare_options("ml-1m", tmp / "ratings.dat", tmp / "ds");
  o.has_min_rating = true;
  o.min_rating = 4;
  const auto meta = prepare_dataset(o);
  EXPECT_EQ(raw_sequences(tmp / "ds"), (Seqs{{"1", {"12", "10"}}, {"3", {"10"}}}));
  EXPECT_EQ(meta.num_items, 2);
  EXPECT_EQ(meta.attributes.at("rows_below_min_rating"), "2");
  EXPECT_NE(meta.attributes.at("filters").find("rating >= 4"), std::string::npos);
}

TEST(Prepare, Ml25mCsvWithHeaderAndHalfStars) {
  TempDir tmp;
  write_file(tmp / "ratings.csv",
             "userId,movieId,rating,timestamp\r\n1,296,5.0,1147880044\r\n1,306,3.5,1147868817\r\n2,296,0.5,1147868828\r\n");
  auto o = prepare_options("ml-25m", tmp / "ratings.csv", tmp / "ds");
  o.has_min_rating = true;
  o.min_rating = 3.5;
  prepare_dataset(o);
  EXPECT_EQ(raw_sequences(tmp / "ds"), (Seqs{{"1", {"306", "296"}}}));
  o = prepare_options("ml-20m", tmp / "ratings.csv", tmp / "ds20");
  EXPECT_EQ(prepare_dataset(o).num_events, 3);
}

TEST(Prepare, TaobaoBehaviorFilter) {
  TempDir tmp;
  write_file(tmp / "UserBehavior.csv",
             "1,100,7,pv,1511544070\n1,101,7,buy,1511544000\n1,102,8,pv,1511544100\n2,100,7,cart,1511500000\n"
             "2,103,9,pv,1511500001\n3,104,9,fav,1511500002\n");
  auto all = prepare_dataset(prepare_options("taobao", tmp / "UserBehavior.csv", tmp / "all"));
  EXPECT_EQ(all.num_events, 6);
  EXPECT_EQ(raw_sequences(tmp / "all").at("1"), (std::vector<std::string>{"101", "100", "102"}));
  EXPECT_EQ(all.attributes.at("rows_pv"), "3");
  EXPECT_EQ(all.attributes.at("rows_buy"), "1");
  auto o = prepare_options("taobao", tmp / "UserBehavior.csv", tmp / "pv");
  o.behaviors = {"pv"};
  prepare_dataset(o);
  EXPECT_EQ(raw_sequences(tmp / "pv"), (Seqs{{"1", {"100", "102"}}, {"2", {"103"}}}));
  o = prepare_options("taobao", tmp / "UserBehavior.csv", tmp / "buycart");
  o.behaviors = {"buy", "cart"};
  prepare_dataset(o);
  EXPECT_EQ(raw_sequences(tmp / "buycart"), (Seqs{{"1", {"101"}}, {"2", {"100"}}}));
}

TEST(Prepare, GenericColumnsDelimiterHeaderAndStringIds) {
  TempDir tmp;
  write_file(tmp / "log.tsv", "who\tjunk\twhat\twhen\nbob\tx\titemB\t5\nalice\ty\titemA\t9\nbob\tz\titemA\t1\n");
  auto o = prepare_options("generic", tmp / "log.tsv", tmp / "ds");
  o.columns = {"user", "ignore", "item", "time"};
  o.delimiter = '\t';
  o.header = true;
  const auto meta = prepare_dataset(o);
  EXPECT_TRUE(meta.has_timestamps);
  // String ids sort bytewise: alice = user 0; itemA = item 1.
  EXPECT_EQ(read_raw_ids(tmp / "ds", "user"), (std::vector<std::string>{"alice", "bob"}));
  EXPECT_EQ(read_raw_ids(tmp / "ds", "item"), (std::vector<std::string>{"itemA", "itemB"}));
  EXPECT_EQ(raw_sequences(tmp / "ds"), (Seqs{{"alice", {"itemA"}}, {"bob", {"itemA", "itemB"}}}));

  // All-integer generic ids are stored as int64; a mix falls back to strings.
  write_file(tmp / "num.csv", "5,70\n3,70\n5,8\n");
  o = prepare_options("generic", tmp / "num.csv", tmp / "num");
  o.columns = {"user", "item"};
  prepare_dataset(o);
  write_file(tmp / "mix.csv", "5,70\n3,x70\n");
  o = prepare_options("generic", tmp / "mix.csv", tmp / "mix");
  o.columns = {"user", "item"};
  prepare_dataset(o);
  EXPECT_EQ(read_raw_ids(tmp / "num", "item"), (std::vector<std::string>{"8", "70"}));
  EXPECT_EQ(read_raw_ids(tmp / "mix", "item"), (std::vector<std::string>{"70", "x70"}));
  for (const auto& [dir, want] : std::vector<std::pair<std::string, H5T_class_t>>{{"num", H5T_INTEGER}, {"mix", H5T_STRING}}) {
    hid_t f = H5Fopen((tmp / dir + "/meta.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "item_raw_ids", H5P_DEFAULT);
    hid_t t = H5Dget_type(d);
    EXPECT_EQ(H5Tget_class(t), want) << dir;
    H5Tclose(t);
    H5Dclose(d);
    H5Fclose(f);
  }
}

TEST(Prepare, KcoreIsIterative) {
  TempDir tmp;
  // k = 2. D has one row: removing it drops item 3 to one row, which removes C's row with
  // item 3, which drops C to one row and removes C entirely. A single pass would keep C.
  write_file(tmp / "k.txt", "1 1\n1 2\n2 1\n2 2\n3 1\n3 3\n4 3\n");
  auto o = prepare_options("sasrec", tmp / "k.txt", tmp / "ds");
  o.kcore = 2;
  const auto meta = prepare_dataset(o);
  EXPECT_EQ(raw_sequences(tmp / "ds"), (Seqs{{"1", {"1", "2"}}, {"2", {"1", "2"}}}));
  EXPECT_EQ(meta.attributes.at("rows_removed_by_kcore"), "3");
  EXPECT_GE(std::stoi(meta.attributes.at("kcore_passes")), 1);
  // Nothing survives a 3-core.
  o = prepare_options("sasrec", tmp / "k.txt", tmp / "ds3");
  o.kcore = 3;
  expect_error([&] { prepare_dataset(o); }, {"k.txt", "no interactions left after filtering", "3-core"});
  EXPECT_FALSE(fs::exists(tmp / "ds3"));
}

TEST(Prepare, KcoreMatchesABruteForceFixedPoint) {
  TempDir tmp;
  // A random-ish graph; the brute force removes one offending row at a time.
  std::vector<std::pair<int, int>> rows;
  uint64_t x = 12345;
  for (int r = 0; r < 3000; ++r) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const int u = 1 + static_cast<int>((x >> 33) % 300);
    const int i = 1 + static_cast<int>(((x >> 13) % 1000) * ((x >> 13) % 1000) / 4000);  // skewed items
    rows.emplace_back(u, i);
  }
  std::string content;
  for (auto [u, i] : rows) content += std::to_string(u) + " " + std::to_string(i) + "\n";
  write_file(tmp / "g.txt", content);
  const int k = 5;
  std::vector<bool> alive(rows.size(), true);
  for (bool changed = true; changed;) {
    changed = false;
    std::map<int, int> ud, id;
    for (size_t r = 0; r < rows.size(); ++r)
      if (alive[r]) ++ud[rows[r].first], ++id[rows[r].second];
    for (size_t r = 0; r < rows.size(); ++r)
      if (alive[r] && (ud[rows[r].first] < k || id[rows[r].second] < k)) {
        alive[r] = false;
        changed = true;
        break;
      }
  }
  Seqs want;
  for (size_t r = 0; r < rows.size(); ++r)
    if (alive[r]) want[std::to_string(rows[r].first)].push_back(std::to_string(rows[r].second));
  auto o = prepare_options("sasrec", tmp / "g.txt", tmp / "ds");
  o.kcore = k;
  prepare_dataset(o);
  EXPECT_EQ(raw_sequences(tmp / "ds"), want);
  EXPECT_GT(want.size(), 10u);
}

TEST(Prepare, UserFeaturesJoinThroughAnIdMap) {
  TempDir tmp;
  write_file(tmp / "users.dat", "1::F::1::10::48067\n2::M::56::16::70072\n3::M::25::15::55117-1234\n");
  write_file(tmp / "map.txt", "100 2\n200 3\n300 9\n");
  write_file(tmp / "seq.txt", "300 1\n100 1\n100 2\n200 2\n");
  auto o = prepare_options("sasrec", tmp / "seq.txt", tmp / "ds");
  o.user_features = tmp / "users.dat";
  o.user_id_map = tmp / "map.txt";
  const auto meta = prepare_dataset(o);
  EXPECT_EQ(meta.user_feature_names, (std::vector<std::string>{"gender", "age", "occupation", "zip_prefix"}));
  EXPECT_EQ(meta.user_feature_cardinalities, (std::vector<int64_t>{2, 3, 3, 3}));
  EXPECT_EQ(meta.attributes.at("users_without_features"), "1");
  const auto seqs = load_shards(tmp / "ds", meta, 0, 1);
  // Users 100, 200, 300 -> originals 2 (M, 56, 16, "7"), 3 (M, 25, 15, "5"), none.
  // Codes in sorted value order: F=1 M=2; ages 1,25,56; occupations 10,15,16; zips 4,5,7.
  EXPECT_EQ(seqs.user_features, (std::vector<int32_t>{2, 3, 3, 3, 2, 2, 2, 2, 0, 0, 0, 0}));

  // Without a map the dataset's ids are users.dat's ids.
  write_file(tmp / "ratings.dat", "3::7::5::1\n1::7::5::2\n");
  o = prepare_options("ml-1m", tmp / "ratings.dat", tmp / "direct");
  o.user_features = tmp / "users.dat";
  const auto direct = prepare_dataset(o);
  EXPECT_EQ(load_shards(tmp / "direct", direct, 0, 1).user_features, (std::vector<int32_t>{1, 1, 1, 1, 2, 2, 2, 2}));

  // No user matches: a wrong or missing map, said so.
  o = prepare_options("sasrec", tmp / "seq.txt", tmp / "nomap");
  o.user_features = tmp / "users.dat";
  expect_error([&] { prepare_dataset(o); }, {"users.dat", "none of the dataset's 3 users", "user_id_map"});
  write_file(tmp / "bad-users.dat", "1::F::1::10::48067\n2::M::old::16::70072\n");
  o.user_features = tmp / "bad-users.dat";
  expect_error([&] { prepare_dataset(o); }, {"bad-users.dat:2", "field 'Age'", "'old'"});
}

TEST(Prepare, ShardsHoldContiguousUsersWithBalancedEvents) {
  TempDir tmp;
  std::string content;
  int64_t events = 0;
  for (int u = 1; u <= 40; ++u)
    for (int j = 0; j < 1 + (u * 13) % 29; ++j, ++events) content += std::to_string(u) + " " + std::to_string(1 + j % 9) + "\n";
  write_file(tmp / "s.txt", content);
  auto o = prepare_options("sasrec", tmp / "s.txt", tmp / "ds");
  o.shards = 4;
  const auto meta = prepare_dataset(o);
  ASSERT_EQ(meta.shard_user_begin.size(), 5u);
  EXPECT_EQ(meta.shard_user_begin.front(), 0);
  EXPECT_EQ(meta.shard_user_begin.back(), 40);
  int64_t total = 0;
  for (int s = 0; s < 4; ++s) {
    EXPECT_GT(meta.shard_user_begin[s + 1], meta.shard_user_begin[s]);
    EXPECT_NEAR(meta.shard_num_events[s], events / 4.0, 30) << "shard " << s;  // within one user's length
    EXPECT_TRUE(fs::exists(tmp / ("ds/" + shard_file_name(s, 4))));
    total += meta.shard_num_events[s];
  }
  EXPECT_EQ(total, events);
  // More shards than users: empty shards are allowed and load as empty ranges.
  o = prepare_options("sasrec", tmp / "s.txt", tmp / "many");
  std::string two = "1 1\n2 2\n";
  write_file(tmp / "two.txt", two);
  o.input = tmp / "two.txt";
  o.shards = 5;
  const auto many = prepare_dataset(o);
  EXPECT_EQ(many.shard_user_begin.front(), 0);
  EXPECT_EQ(many.shard_user_begin.back(), 2);
  EXPECT_TRUE(std::is_sorted(many.shard_user_begin.begin(), many.shard_user_begin.end()));
  int64_t users = 0;
  for (int r = 0; r < 5; ++r) users += load_shards(tmp / "many", many, r, 5).num_users();
  EXPECT_EQ(users, 2);
}

struct BadCase {
  std::string format, content;
  std::vector<std::string> expect;
};

TEST(Prepare, BadInputsNameFileLineAndField) {
  TempDir tmp;
  const std::vector<BadCase> cases = {
      {"sasrec", "1 5\n1 6\n2 x7\n", {"bad.txt:3: field 'item': 'x7' is not an integer"}},
      {"sasrec", "1 5\nu 5\n", {"bad.txt:2: field 'user': 'u' is not an integer"}},
      {"sasrec", "1 5\n7\n", {"bad.txt:2:", "expected 2 fields", "got 1"}},
      {"sasrec", "1 5 9\n", {"bad.txt:1:", "expected 2 fields"}},
      {"sasrec", "", {"bad.txt", "no interactions"}},
      {"sasrec", "\n\r\n  \n", {"bad.txt", "no interactions"}},
      {"ml-1m", "1::2::5\n", {"bad.txt:1:", "expected 4 fields", "UserID::MovieID::Rating::Timestamp"}},
      {"ml-1m", "1::2::5::1\n1::2::5::abc\n", {"bad.txt:2: field 'timestamp': 'abc' is not an integer"}},
      {"ml-1m", "1::2::five::3\n", {"bad.txt:1: field 'rating': 'five' is not a number"}},
      {"ml-25m", "1,2,3.5,100\n", {"bad.txt:1:", "expected the header 'userId,movieId,rating,timestamp'"}},
      {"ml-25m", "userId,movieId,rating,timestamp\n1,2,3.5\n", {"bad.txt:2:", "expected 4 fields"}},
      {"taobao", "1,2,3,pv,100\n1,2,3,click,100\n", {"bad.txt:2: field 'behavior': 'click' is not one of pv, buy, cart, fav"}},
      {"taobao", "1,2,3,pv,\n", {"bad.txt:1: field 'timestamp': '' is not an integer"}},
      {"taobao", "1,,3,pv,5\n", {"bad.txt:1: field 'item': '' is empty"}},
      {"generic", "a,b,noon\n", {"bad.txt:1: field 'timestamp': 'noon' is not an integer"}},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    write_file(tmp / "bad.txt", cases[c].content);
    auto o = prepare_options(cases[c].format, tmp / "bad.txt", tmp / "out");
    if (cases[c].format == "generic") o.columns = {"user", "item", "time"};
    try {
      prepare_dataset(o);
      ADD_FAILURE() << "case " << c << ": no error";
    } catch (const std::runtime_error& e) {
      for (const auto& part : cases[c].expect)
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "case " << c << ": '" << part << "' not in: " << e.what();
    }
    EXPECT_FALSE(fs::exists(tmp / "out")) << "case " << c;
    expect_no_temp_dirs(tmp.path());
  }
}

TEST(Prepare, BadOptionsAreNamed) {
  TempDir tmp;
  write_file(tmp / "ok.txt", "1 2\n");
  expect_error([&] { prepare_dataset(prepare_options("nosuch", tmp / "ok.txt", tmp / "o")); },
               {"unknown format 'nosuch'", "sasrec", "ml-1m", "ml-25m", "taobao", "generic"});
  expect_error([&] { prepare_dataset(prepare_options("sasrec", tmp / "missing.txt", tmp / "o")); },
               {"missing.txt", "cannot open"});
  auto o = prepare_options("sasrec", tmp / "ok.txt", tmp / "o");
  o.has_min_rating = true;
  expect_error([&] { prepare_dataset(o); }, {"min_rating", "sasrec", "no ratings"});
  o = prepare_options("ml-1m", tmp / "ok.txt", tmp / "o");
  o.behaviors = {"pv"};
  expect_error([&] { prepare_dataset(o); }, {"behaviors", "taobao"});
  o = prepare_options("taobao", tmp / "ok.txt", tmp / "o");
  o.behaviors = {"click"};
  expect_error([&] { prepare_dataset(o); }, {"unknown behavior 'click'"});
  o = prepare_options("generic", tmp / "ok.txt", tmp / "o");
  o.columns = {"user", "stuff"};
  expect_error([&] { prepare_dataset(o); }, {"unknown column 'stuff'"});
  o.columns = {"user", "time"};
  expect_error([&] { prepare_dataset(o); }, {"exactly one 'user' and one 'item'"});
  o = prepare_options("sasrec", tmp / "ok.txt", tmp / "o");
  o.shards = 0;
  expect_error([&] { prepare_dataset(o); }, {"shards must be >= 1"});
  o = prepare_options("sasrec", tmp / "ok.txt", tmp / "o");
  o.user_id_map = tmp / "ok.txt";
  expect_error([&] { prepare_dataset(o); }, {"user_id_map", "user_features"});
  EXPECT_FALSE(fs::exists(tmp / "o"));
}

TEST(Prepare, NeverOverwritesUserData) {
  TempDir tmp;
  write_file(tmp / "ok.txt", "1 2\n");
  fs::create_directories(tmp / "full");
  write_file(tmp / "full/precious.txt", "keep me");
  expect_error([&] { prepare_dataset(prepare_options("sasrec", tmp / "ok.txt", tmp / "full")); }, {"full", "not empty"});
  EXPECT_EQ(read_file(tmp / "full/precious.txt"), "keep me");
  write_file(tmp / "afile", "x");
  expect_error([&] { prepare_dataset(prepare_options("sasrec", tmp / "ok.txt", tmp / "afile")); }, {"not a directory"});
  // An existing empty directory is fine, as is a missing parent and a trailing slash.
  fs::create_directories(tmp / "empty");
  EXPECT_EQ(prepare_dataset(prepare_options("sasrec", tmp / "ok.txt", tmp / "empty")).num_events, 1);
  EXPECT_EQ(prepare_dataset(prepare_options("sasrec", tmp / "ok.txt", tmp / "a/b/c/")).num_events, 1);
  EXPECT_TRUE(fs::exists(tmp / "a/b/c/meta.h5"));
  expect_no_temp_dirs(tmp.path());
}

TEST(DatasetWriter, AnUncommittedWriterLeavesNothing) {
  TempDir tmp;
  std::string temp;
  {
    DatasetWriter w(tmp / "ds");
    temp = w.temp_dir();
    const std::vector<int64_t> offsets = {0, 2};
    const std::vector<int32_t> items = {1, 2};
    w.write_shard(0, 1, ShardView{0, 1, offsets.data(), items.data(), nullptr, nullptr, 0});
    EXPECT_TRUE(fs::exists(temp + "/" + shard_file_name(0, 1)));
  }  // as when an exception unwinds past it
  EXPECT_FALSE(fs::exists(temp));
  EXPECT_FALSE(fs::exists(tmp / "ds"));
}

}  // namespace
