// The synthetic generator: deterministic in the seed, independent of the shard count,
// exact counts, and structure a next-item model can learn.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <unordered_map>

#include "io/build_info.h"
#include "io_test_util.h"

namespace {
using namespace seqrec::io;
using namespace seqrec::testing;

SynthOptions synth_options(const std::string& out, uint64_t seed, int64_t shards = 1) {
  SynthOptions o;
  o.out = out;
  o.users = 300;
  o.items = 200;
  o.events = 12000;
  o.seed = seed;
  o.shards = shards;
  o.progress = false;
  return o;
}

UserSequences load_all(const std::string& dir) { return load_shards(dir, read_meta(dir), 0, 1); }

TEST(Synth, SameSeedSameDataAnyShardCount) {
  TempDir tmp;
  synth_dataset(synth_options(tmp / "a", 7));
  synth_dataset(synth_options(tmp / "b", 7));
  synth_dataset(synth_options(tmp / "c", 7, /*shards=*/3));
  synth_dataset(synth_options(tmp / "d", 8));
  const auto a = load_all(tmp / "a"), b = load_all(tmp / "b"), c = load_all(tmp / "c"), d = load_all(tmp / "d");
  EXPECT_EQ(a.items, b.items);
  EXPECT_EQ(a.offsets, b.offsets);
  EXPECT_EQ(a.items, c.items) << "users are generated from their own keyed RNG";
  EXPECT_EQ(a.offsets, c.offsets);
  EXPECT_NE(a.items, d.items);
  EXPECT_NE(a.offsets, d.offsets);
  EXPECT_EQ(read_meta(tmp / "a").shard_checksums, read_meta(tmp / "b").shard_checksums);
  EXPECT_EQ(read_meta(tmp / "a").attributes.at("created_by"), "seqrec synth, " + describe_build());
}

TEST(Synth, CountsAndStatistics) {
  TempDir tmp;
  const auto o = synth_options(tmp / "s", 3, 4);
  const auto meta = synth_dataset(o);
  EXPECT_EQ(meta.source_format, "synth");
  EXPECT_EQ(meta.source_checksum, "");
  EXPECT_EQ(meta.num_users, o.users);
  EXPECT_EQ(meta.num_items, o.items);
  EXPECT_EQ(meta.num_events, o.events);
  EXPECT_EQ(meta.num_shards, 4);
  EXPECT_FALSE(meta.has_timestamps);
  EXPECT_EQ(meta.attributes.at("synth_seed"), "3");
  EXPECT_EQ(meta.attributes.at("synth_clusters"), "14");  // round(sqrt(200))
  const auto s = load_all(tmp / "s");
  int64_t min_len = INT64_MAX, max_len = 0;
  std::vector<int64_t> count(o.items + 1, 0);
  for (int64_t u = 0; u < s.num_users(); ++u) {
    min_len = std::min(min_len, s.length(u));
    max_len = std::max(max_len, s.length(u));
  }
  for (int32_t i : s.items) ++count.at(i);
  EXPECT_GE(min_len, 3);
  EXPECT_GT(max_len, 2 * o.events / o.users) << "lengths vary";
  EXPECT_EQ(meta.attributes.at("seq_len_min"), std::to_string(min_len));
  EXPECT_EQ(meta.attributes.at("seq_len_mean"), "40");
  // Zipf within clusters: the most popular item is far above the average.
  EXPECT_GT(*std::max_element(count.begin(), count.end()), 4 * o.events / o.items);
  EXPECT_EQ(count[0], 0) << "0 is padding";
  // Shards balanced by events.
  for (int64_t e : meta.shard_num_events) EXPECT_NEAR(e, o.events / 4.0, o.events / 10.0);
}

// Hit rate at 10 of the last item given the history, for a first-order item bigram model and
// for global popularity, both counted on the other transitions: the structure must show.
TEST(Synth, NextItemIsPredictableBeyondPopularity) {
  TempDir tmp;
  auto o = synth_options(tmp / "s", 11);
  o.users = 1000;
  o.items = 400;
  o.events = 60000;
  synth_dataset(o);
  const auto s = load_all(tmp / "s");
  std::vector<int64_t> pop(o.items + 1, 0);
  std::unordered_map<int64_t, std::unordered_map<int32_t, int64_t>> bigram;
  for (int64_t u = 0; u < s.num_users(); ++u) {
    const int32_t* x = s.items_of(u);
    const int64_t n = s.length(u) - 1;  // the last item is held out
    for (int64_t t = 0; t < n; ++t) {
      ++pop[x[t]];
      if (t > 0) ++bigram[x[t - 1]][x[t]];
    }
  }
  auto top10 = [](std::vector<std::pair<int64_t, int32_t>> scored) {
    std::partial_sort(scored.begin(), scored.begin() + std::min<size_t>(10, scored.size()), scored.end(),
                      [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    scored.resize(std::min<size_t>(10, scored.size()));
    return scored;
  };
  std::vector<std::pair<int64_t, int32_t>> by_pop;
  for (int32_t i = 1; i <= o.items; ++i) by_pop.emplace_back(pop[i], i);
  const auto pop_top = top10(by_pop);
  int64_t hit_pop = 0, hit_bigram = 0;
  for (int64_t u = 0; u < s.num_users(); ++u) {
    const int32_t* x = s.items_of(u);
    const int64_t n = s.length(u);
    const int32_t target = x[n - 1], prev = x[n - 2];
    for (auto& [score, i] : pop_top) hit_pop += i == target;
    std::vector<std::pair<int64_t, int32_t>> cand;
    for (auto& [i, c] : bigram[prev]) cand.emplace_back(c, i);
    for (auto& [score, i] : top10(cand)) hit_bigram += i == target;
  }
  const double hr_pop = static_cast<double>(hit_pop) / s.num_users(), hr_bigram = static_cast<double>(hit_bigram) / s.num_users();
  std::printf("HR@10 popularity %.3f, item bigram %.3f\n", hr_pop, hr_bigram);
  EXPECT_GT(hr_bigram, 1.5 * hr_pop);
  EXPECT_GT(hr_bigram - hr_pop, 0.1);
}

TEST(Synth, StreamsAMillionEventsQuickly) {
  TempDir tmp;
  SynthOptions o;
  o.out = tmp / "m";
  o.users = 10000;
  o.items = 20000;
  o.events = 1000000;
  o.shards = 4;
  o.progress = false;
  const auto t0 = std::chrono::steady_clock::now();
  const auto meta = synth_dataset(o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("synth: %lld events in %.3f s = %.2f M events/s\n", static_cast<long long>(meta.num_events), s,
              meta.num_events / s / 1e6);
  RecordProperty("events_per_second", std::to_string(static_cast<int64_t>(meta.num_events / s)));
  EXPECT_EQ(meta.num_events, o.events);
  EXPECT_LT(s, 20.0);
}

TEST(Synth, BadOptions) {
  TempDir tmp;
  auto o = synth_options(tmp / "x", 1);
  o.events = 10;
  expect_error([&] { synth_dataset(o); }, {"events must be >= 3 * users"});
  o = synth_options(tmp / "x", 1);
  o.items = 1;
  expect_error([&] { synth_dataset(o); }, {"items must be >= 2"});
  o = synth_options(tmp / "x", 1);
  o.clusters = 1000;
  expect_error([&] { synth_dataset(o); }, {"clusters"});
  o = synth_options(tmp / "x", 1);
  o.stay = 1.5;
  expect_error([&] { synth_dataset(o); }, {"stay"});
  fs::create_directories(tmp / "full");
  write_file(tmp / "full/x", "1");
  expect_error([&] { synth_dataset(synth_options(tmp / "full", 1)); }, {"full", "not empty"});
  EXPECT_FALSE(fs::exists(tmp / "x"));
}

}  // namespace
