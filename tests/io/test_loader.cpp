// The training batch stream: leave-one-out targets, left padding, negatives outside the
// user's items, and the same examples and negatives at any world size.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "io/loader.h"

namespace {
using namespace seqrec::io;

// 23 users with lengths 1..23 over 40 items; user u's items are a deterministic walk.
UserSequences make_users(int64_t begin, int64_t end, int64_t num_items) {
  UserSequences s;
  s.user_begin = begin;
  s.user_end = end;
  s.offsets = {0};
  for (int64_t u = begin; u < end; ++u) {
    const int64_t n = u + 1;
    for (int64_t i = 0; i < n; ++i) s.items.push_back(static_cast<int32_t>(1 + (u * 7 + i * 3) % num_items));
    s.offsets.push_back(static_cast<int64_t>(s.items.size()));
  }
  return s;
}

DatasetMeta make_meta(int64_t users, int64_t items) {
  DatasetMeta m;
  m.num_users = users;
  m.num_items = items;
  return m;
}

LoaderOptions opts(int64_t batch, int prefetch = 0) {
  LoaderOptions o;
  o.max_len = 6;
  o.batch_size = batch;
  o.seed = 9;
  o.prefetch = prefetch;
  return o;
}

// Rows of a batch keyed by user, for comparing batches across world sizes.
std::map<int64_t, std::vector<int64_t>> rows(const TrainBatch& b) {
  std::map<int64_t, std::vector<int64_t>> out;
  for (int64_t r = 0; r < b.users.size(0); ++r) {
    std::vector<int64_t> v;
    for (auto* t : {&b.input, &b.pos, &b.neg})
      for (int64_t j = 0; j < t->size(1); ++j) v.push_back((*t)[r][j].item<int64_t>());
    out[b.users[r].item<int64_t>()] = v;
  }
  return out;
}

TEST(KeyedRng, IsDeterministicAndInRange) {
  KeyedRng a(1, 2, 3), b(1, 2, 3), c(1, 2, 4);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.below(17);
    EXPECT_EQ(x, b.below(17));
    EXPECT_LT(x, 17u);
    differs |= x != c.below(17);
    const double u = a.uniform();
    b.uniform();
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
  EXPECT_TRUE(differs);
}

TEST(TrainLoader, TargetsPaddingAndNegatives) {
  const int64_t U = 23, N = 40;
  auto seqs = make_users(0, U, N);
  TrainLoader loader(seqs, make_meta(U, N), opts(5), 0, 1);
  EXPECT_EQ(loader.steps_per_epoch(), 5);
  std::set<int64_t> seen_users;
  for (int64_t step = 0; step < loader.steps_per_epoch(); ++step) {
    auto b = loader.next();
    EXPECT_EQ(b.cursor.step, step);
    for (int64_t r = 0; r < b.users.size(0); ++r) {
      const int64_t u = b.users[r].item<int64_t>();
      EXPECT_TRUE(seen_users.insert(u).second) << "user " << u << " twice in an epoch";
      const int32_t* s = seqs.items_of(u);
      const int64_t m = train_length(seqs.length(u));
      std::set<int64_t> train_items(s, s + m);
      const int64_t count = m >= 2 ? std::min<int64_t>(m - 1, 6) : 0;
      for (int64_t j = 0; j < 6; ++j) {
        const int64_t in = b.input[r][j].item<int64_t>(), pos = b.pos[r][j].item<int64_t>(),
                      neg = b.neg[r][j].item<int64_t>();
        if (j < 6 - count) {
          EXPECT_EQ(in, 0);
          EXPECT_EQ(pos, 0);
          EXPECT_EQ(neg, 0);
          continue;
        }
        const int64_t t = m - 1 - count + (j - (6 - count));  // index of the input item
        EXPECT_EQ(in, s[t]);
        EXPECT_EQ(pos, s[t + 1]) << "the target is the next training item";
        EXPECT_LT(t + 1, m) << "valid/test items never appear as training targets";
        EXPECT_GE(neg, 1);
        EXPECT_LE(neg, N);
        EXPECT_EQ(train_items.count(neg), 0u) << "negative " << neg << " is in user " << u << "'s items";
      }
    }
  }
  EXPECT_EQ(static_cast<int64_t>(seen_users.size()), U);
  EXPECT_EQ(loader.cursor().epoch, 1);
}

TEST(TrainLoader, SameExamplesAndNegativesAtAnyWorldSize) {
  const int64_t U = 23, N = 40;
  auto all = make_users(0, U, N);
  TrainLoader one(all, make_meta(U, N), opts(6), 0, 1);
  for (int world : {2, 3}) {
    // Contiguous user ranges as the shard reader hands them out.
    std::vector<UserSequences> parts;
    for (int r = 0; r < world; ++r) parts.push_back(make_users(U * r / world, U * (r + 1) / world, N));
    std::vector<std::unique_ptr<TrainLoader>> loaders;
    for (int r = 0; r < world; ++r)
      loaders.push_back(std::make_unique<TrainLoader>(parts[r], make_meta(U, N), opts(6 / world), r, world));
    for (int64_t epoch = 0; epoch < 2; ++epoch)
      for (int64_t step = 0; step < one.steps_per_epoch(); ++step) {
        auto want = rows(one.build({epoch, step}));
        std::map<int64_t, std::vector<int64_t>> got;
        for (auto& l : loaders) {
          auto part = rows(l->build({epoch, step}));
          got.insert(part.begin(), part.end());
        }
        EXPECT_EQ(got, want) << "world " << world << " epoch " << epoch << " step " << step;
      }
  }
}

std::vector<int64_t> window_counts(const UserSequences& s, const LoaderOptions& o) {
  std::vector<int64_t> out;
  for (int64_t u = s.user_begin; u < s.user_end; ++u) out.push_back(examples_of(s.length(u), o));
  return out;
}

// All of a batch's rows as (user, input, pos, neg), sorted: a user may fill several rows.
std::vector<std::vector<int64_t>> sorted_rows(const TrainBatch& b) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < b.users.size(0); ++r) {
    std::vector<int64_t> v{b.users[r].item<int64_t>()};
    for (auto* t : {&b.input, &b.pos, &b.neg})
      for (int64_t j = 0; j < t->size(1); ++j) v.push_back((*t)[r][j].item<int64_t>());
    out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(TrainLoader, WindowsTrainEveryTransitionOncePerEpoch) {
  const int64_t U = 23, N = 40;
  auto seqs = make_users(0, U, N);
  auto o = opts(5);
  o.windows = true;
  EXPECT_THROW(TrainLoader(seqs, make_meta(U, N), o, 0, 1), std::invalid_argument) << "counts are required";
  const auto counts = window_counts(seqs, o);
  TrainLoader loader(seqs, make_meta(U, N), o, 0, 1, counts);
  // Users 0..22 have u + 1 items: train_length u - 1 (u >= 2), transitions u - 2, windows of 6.
  int64_t examples = 0;
  for (int64_t u = 0; u < U; ++u) {
    const int64_t transitions = std::max<int64_t>(0, train_length(u + 1) - 1);
    EXPECT_EQ(counts[u], std::max<int64_t>(1, (transitions + 5) / 6)) << "user " << u;
    examples += counts[u];
  }
  EXPECT_EQ(loader.steps_per_epoch(), (examples + 4) / 5);
  std::map<int64_t, std::multiset<std::pair<int64_t, int64_t>>> trained;  // user -> (input, target)
  for (int64_t step = 0; step < loader.steps_per_epoch(); ++step) {
    auto b = loader.next();
    for (int64_t r = 0; r < b.users.size(0); ++r)
      for (int64_t j = 0; j < 6; ++j)
        if (b.pos[r][j].item<int64_t>() != 0)
          trained[b.users[r].item<int64_t>()].insert({b.input[r][j].item<int64_t>(), b.pos[r][j].item<int64_t>()});
  }
  EXPECT_EQ(loader.cursor().epoch, 1);
  for (int64_t u = 0; u < U; ++u) {
    const int32_t* s = seqs.items_of(u);
    std::multiset<std::pair<int64_t, int64_t>> want;
    for (int64_t t = 0; t + 1 < train_length(seqs.length(u)); ++t) want.insert({s[t], s[t + 1]});
    EXPECT_EQ(trained[u], want) << "user " << u << ": every training transition exactly once";
  }
  // Without windows only the most recent 6 transitions of each user are trained on.
  TrainLoader recent(seqs, make_meta(U, N), opts(5), 0, 1);
  EXPECT_EQ(recent.steps_per_epoch(), 5);
}

// Prefixes (RecBole's scheme): one example per training transition, each the user's history up
// to it, its most recent max_len transitions right-aligned; with last_target_only the target and
// negative stand at the last slot alone. Every prefix once per epoch, nothing of its future in it.
TEST(TrainLoader, PrefixesTrainEveryPrefixOncePerEpoch) {
  const int64_t U = 23, N = 40, L = 6;
  auto seqs = make_users(0, U, N);
  auto o = opts(5);
  o.prefixes = true;
  o.last_target_only = true;
  const auto counts = window_counts(seqs, o);
  int64_t examples = 0;
  for (int64_t u = 0; u < U; ++u) {
    EXPECT_EQ(counts[u], std::max<int64_t>(1, train_length(u + 1) - 1)) << "user " << u;
    examples += counts[u];
  }
  TrainLoader loader(seqs, make_meta(U, N), o, 0, 1, counts);
  EXPECT_EQ(loader.steps_per_epoch(), (examples + 4) / 5);
  std::map<int64_t, std::multiset<std::vector<int64_t>>> trained;  // user -> (input row..., target)
  for (int64_t step = 0; step < loader.steps_per_epoch(); ++step) {
    auto b = loader.next();
    for (int64_t r = 0; r < b.users.size(0); ++r) {
      const auto pos = b.pos[r], neg = b.neg[r];
      EXPECT_EQ(pos.narrow(0, 0, L - 1).abs().sum().item<int64_t>(), 0) << "a target before the last slot";
      EXPECT_EQ(neg.narrow(0, 0, L - 1).abs().sum().item<int64_t>(), 0) << "a negative before the last slot";
      if (pos[L - 1].item<int64_t>() == 0) continue;  // a user with nothing to predict
      EXPECT_NE(neg[L - 1].item<int64_t>(), 0);
      std::vector<int64_t> row(b.input[r].data_ptr<int64_t>(), b.input[r].data_ptr<int64_t>() + L);
      row.push_back(pos[L - 1].item<int64_t>());
      trained[b.users[r].item<int64_t>()].insert(row);
    }
  }
  EXPECT_EQ(loader.cursor().epoch, 1);
  for (int64_t u = 0; u < U; ++u) {
    const int32_t* s = seqs.items_of(u);
    std::multiset<std::vector<int64_t>> want;
    for (int64_t t = 0; t + 1 < train_length(seqs.length(u)); ++t) {  // the prefix s[0..t] -> s[t + 1]
      std::vector<int64_t> row(L, 0);
      for (int64_t j = 0; j < L && t - j >= 0; ++j) row[L - 1 - j] = s[t - j];
      row.push_back(s[t + 1]);
      want.insert(row);
    }
    EXPECT_EQ(trained[u], want) << "user " << u << ": every prefix exactly once";
  }
  // Windows and prefixes together are refused by name.
  o.windows = true;
  try {
    TrainLoader both(seqs, make_meta(U, N), o, 0, 1, counts);
    ADD_FAILURE() << "windows and prefixes together were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("windows and training prefixes exclude each other"), std::string::npos)
        << e.what();
  }
  // Without last_target_only a prefix example holds the next item at every real slot.
  o.windows = false;
  o.last_target_only = false;
  TrainLoader every(seqs, make_meta(U, N), o, 0, 1, counts);
  auto b = every.next();
  EXPECT_EQ(b.pos.ne(0).sum().item<int64_t>(), b.input.ne(0).sum().item<int64_t>());
}

// Windows, and prefixes with their last-slot targets: the same examples at any world size.
TEST(TrainLoader, WindowsAndPrefixesGiveTheSameExamplesAtAnyWorldSize) {
  const int64_t U = 23, N = 40;
  for (bool prefixes : {false, true}) {
    auto o = opts(6);
    o.windows = !prefixes;
    o.prefixes = prefixes;
    o.last_target_only = prefixes;
    auto all = make_users(0, U, N);
    const auto counts = window_counts(all, o);
    TrainLoader one(all, make_meta(U, N), o, 0, 1, counts);
    for (int world : {2, 3}) {
      auto ro = o;
      ro.batch_size = 6 / world;
      std::vector<UserSequences> parts;
      for (int r = 0; r < world; ++r) parts.push_back(make_users(U * r / world, U * (r + 1) / world, N));
      std::vector<std::unique_ptr<TrainLoader>> loaders;
      for (int r = 0; r < world; ++r)
        loaders.push_back(std::make_unique<TrainLoader>(parts[r], make_meta(U, N), ro, r, world, counts));
      for (int64_t step = 0; step < one.steps_per_epoch(); ++step) {
        std::vector<std::vector<int64_t>> got;
        for (auto& l : loaders) {
          auto part = sorted_rows(l->build({1, step}));
          got.insert(got.end(), part.begin(), part.end());
        }
        std::sort(got.begin(), got.end());
        EXPECT_EQ(got, sorted_rows(one.build({1, step}))) << "world " << world << " step " << step
                                                          << (prefixes ? " (prefixes)" : " (windows)");
      }
    }
  }
}

TEST(TrainLoader, EpochsShuffleDifferentlyAndSeekResumes) {
  const int64_t U = 23, N = 40;
  auto seqs = make_users(0, U, N);
  TrainLoader loader(seqs, make_meta(U, N), opts(4, /*prefetch=*/3), 0, 1);
  auto e0 = loader.build({0, 0}), e1 = loader.build({1, 0});
  EXPECT_FALSE(torch::equal(e0.users, e1.users));
  std::vector<TrainBatch> stream;
  for (int i = 0; i < 9; ++i) stream.push_back(loader.next());
  loader.seek({1, 1});
  auto again = loader.next();
  EXPECT_TRUE(torch::equal(again.input, stream[7].input));
  EXPECT_TRUE(torch::equal(again.neg, stream[7].neg));
  EXPECT_EQ(again.cursor.epoch, 1);
  EXPECT_EQ(again.cursor.step, 1);
  EXPECT_THROW(loader.seek({0, 99}), std::invalid_argument);
}

TEST(TrainLoader, PrefetchedStreamEqualsSynchronous) {
  const int64_t U = 23, N = 40;
  auto seqs = make_users(0, U, N);
  TrainLoader sync(seqs, make_meta(U, N), opts(4, 0), 0, 1), pre(seqs, make_meta(U, N), opts(4, 2), 0, 1);
  for (int i = 0; i < 14; ++i) {
    auto a = sync.next(), b = pre.next();
    EXPECT_TRUE(torch::equal(a.input, b.input));
    EXPECT_TRUE(torch::equal(a.neg, b.neg));
  }
}

}  // namespace
