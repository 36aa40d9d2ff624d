// synth_dataset: a deterministic synthetic dataset with learnable sequential structure.
//
// Items 1..N are shuffled into C clusters. Within a cluster, item popularity is Zipf
// (weight 1/rank^zipf). Each cluster has a few likely successor clusters (a sparse Markov
// chain). A user starts in a random cluster; for each next event, with probability `stay`
// the cluster follows the chain, otherwise it jumps to a uniformly random cluster; the item
// is drawn from the cluster. Knowing the last item's cluster narrows the next item to a
// few clusters, so a next-item model beats popularity clearly.
//
// Every user is generated from its own keyed RNG (seed, user), so the data do not depend
// on the shard count, and generation streams: one shard's events in memory at a time.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <stdexcept>

#include "io/build_info.h"
#include "io/format.h"
#include "io/loader.h"
#include "io/prepare.h"
#include "io/progress.h"
#include "io/writer.h"

namespace seqrec::io {
namespace {

constexpr uint64_t kStructureTag = 0x5354525543ull;  // clusters, successors
constexpr uint64_t kLengthTag = 0x4C454E47ull;
constexpr uint64_t kWalkTag = 0x57414C4Bull;
constexpr int kMinLength = 3;
constexpr double kLengthSigma = 1.0;  // lognormal spread of sequence lengths (ML-1M's median/mean ~ 0.6)
constexpr double kSuccessorWeights[] = {0.5, 0.3, 0.2};

struct Catalogue {
  int64_t clusters = 0;
  std::vector<int32_t> items;           // items of cluster c at [begin[c], begin[c+1])
  std::vector<int64_t> begin;
  std::vector<double> cdf;              // cumulative Zipf weights, aligned with items
  std::vector<std::vector<int32_t>> successors;
  std::vector<double> successor_cdf;    // shared by all clusters

  int32_t draw_item(int64_t c, KeyedRng& rng) const {
    const auto first = cdf.begin() + begin[c], last = cdf.begin() + begin[c + 1];
    const double x = rng.uniform() * *(last - 1);
    auto it = std::upper_bound(first, last, x);
    if (it == last) --it;
    return items[it - cdf.begin()];
  }
  int64_t next_cluster(int64_t c, double stay, KeyedRng& rng) const {
    if (rng.uniform() >= stay) return static_cast<int64_t>(rng.below(clusters));
    const auto& s = successors[c];
    const double x = rng.uniform() * successor_cdf[s.size() - 1];
    size_t k = 0;
    while (k + 1 < s.size() && x >= successor_cdf[k]) ++k;
    return s[k];
  }
};

Catalogue make_catalogue(const SynthOptions& o, int64_t clusters) {
  Catalogue cat;
  cat.clusters = clusters;
  KeyedRng rng(o.seed, kStructureTag);
  const int64_t N = o.items;
  cat.items.resize(N);
  for (int64_t i = 0; i < N; ++i) cat.items[i] = static_cast<int32_t>(i + 1);
  for (int64_t i = N - 1; i > 0; --i) std::swap(cat.items[i], cat.items[rng.below(i + 1)]);
  cat.begin.resize(clusters + 1);
  for (int64_t c = 0; c <= clusters; ++c) cat.begin[c] = c * N / clusters;
  cat.cdf.resize(N);
  for (int64_t c = 0; c < clusters; ++c) {
    double acc = 0;
    for (int64_t j = cat.begin[c]; j < cat.begin[c + 1]; ++j) {
      acc += 1.0 / std::pow(static_cast<double>(j - cat.begin[c] + 1), o.zipf);
      cat.cdf[j] = acc;
    }
  }
  const int64_t k = std::min<int64_t>(3, std::max<int64_t>(clusters - 1, 1));
  double acc = 0;
  for (int64_t j = 0; j < k; ++j) cat.successor_cdf.push_back(acc += kSuccessorWeights[j]);
  cat.successors.resize(clusters);
  for (int64_t c = 0; c < clusters; ++c) {
    auto& s = cat.successors[c];
    if (clusters == 1) {
      s.push_back(0);
      continue;
    }
    while (static_cast<int64_t>(s.size()) < k) {
      const int32_t d = static_cast<int32_t>(rng.below(clusters));
      if (d != c && std::find(s.begin(), s.end(), d) == s.end()) s.push_back(d);
    }
  }
  return cat;
}

// Sequence lengths: kMinLength each, the rest shared in proportion to lognormal weights,
// rounded on the cumulative sum so the total is exactly `events`. Returns prefix sums.
std::vector<int64_t> length_prefix(const SynthOptions& o) {
  const int64_t U = o.users;
  std::vector<double> w(U);
  double total = 0;
  for (int64_t u = 0; u < U; ++u) {
    KeyedRng rng(o.seed, kLengthTag, static_cast<uint64_t>(u));
    // Box-Muller; 1 - uniform() is in (0, 1], so the log is finite.
    const double z = std::sqrt(-2.0 * std::log(1.0 - rng.uniform())) * std::cos(2.0 * M_PI * rng.uniform());
    total += w[u] = std::exp(kLengthSigma * z);
  }
  const double extra = static_cast<double>(o.events - kMinLength * U);
  std::vector<int64_t> prefix(U + 1, 0);
  double cum = 0;
  for (int64_t u = 0; u < U; ++u) {
    cum += w[u];
    prefix[u + 1] = kMinLength * (u + 1) + static_cast<int64_t>(std::llround(extra * std::min(1.0, cum / total)));
    prefix[u + 1] = std::max(prefix[u + 1], prefix[u] + kMinLength);
  }
  prefix[U] = o.events;
  return prefix;
}

}  // namespace

DatasetMeta synth_dataset(const SynthOptions& o) {
  if (o.users < 1) throw std::runtime_error("synth: users must be >= 1, got " + std::to_string(o.users));
  if (o.items < 2) throw std::runtime_error("synth: items must be >= 2, got " + std::to_string(o.items));
  if (o.items > INT32_MAX) throw std::runtime_error("synth: items must fit in int32");
  if (o.events < kMinLength * o.users)
    throw std::runtime_error("synth: events must be >= 3 * users (" + std::to_string(kMinLength * o.users) + "), got " +
                             std::to_string(o.events));
  if (o.shards < 1) throw std::runtime_error("synth: shards must be >= 1, got " + std::to_string(o.shards));
  if (o.clusters < 0 || o.clusters > o.items)
    throw std::runtime_error("synth: clusters must be in [0, items], got " + std::to_string(o.clusters));
  if (!(o.zipf >= 0)) throw std::runtime_error("synth: zipf must be >= 0");
  if (!(o.stay >= 0 && o.stay <= 1)) throw std::runtime_error("synth: stay must be in [0, 1]");
  check_output_dir(o.out);

  const int64_t clusters =
      o.clusters > 0 ? o.clusters : std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(o.items))));
  const Catalogue cat = make_catalogue(o, clusters);
  const std::vector<int64_t> prefix = length_prefix(o);

  DatasetMeta meta;
  meta.name = "synth";
  meta.source_format = "synth";
  meta.num_users = o.users;
  meta.num_items = o.items;
  meta.num_events = o.events;
  meta.num_shards = o.shards;
  meta.has_timestamps = false;
  meta.shard_user_begin = split_users_by_events(prefix, o.shards);
  auto& a = meta.attributes;
  a["created_by"] = "seqrec synth, " + describe_build();
  a["generator"] =
      "items shuffled into clusters, Zipf within a cluster; per event the cluster follows a sparse Markov chain "
      "(3 successors, p = 0.5/0.3/0.2) with probability 'stay', else jumps uniformly";
  a["synth_seed"] = std::to_string(o.seed);
  a["synth_users"] = std::to_string(o.users);
  a["synth_items"] = std::to_string(o.items);
  a["synth_events"] = std::to_string(o.events);
  a["synth_clusters"] = std::to_string(clusters);
  a["synth_zipf"] = std::to_string(o.zipf);
  a["synth_stay"] = std::to_string(o.stay);
  a["synth_lengths"] = "3 + the rest in proportion to lognormal(0, 1) weights";
  a["split"] = kSplitRule;
  a["order"] = "generation order per user";

  DatasetWriter writer(o.out);
  Progress progress(o.progress, "synth");
  std::vector<int64_t> local;
  std::vector<int32_t> items;
  for (int64_t s = 0; s < o.shards; ++s) {
    const int64_t ub = meta.shard_user_begin[s], ue = meta.shard_user_begin[s + 1];
    local.assign(prefix.begin() + ub, prefix.begin() + ue + 1);
    for (auto& v : local) v -= prefix[ub];
    items.assign(local.back(), 0);
    for (int64_t u = ub; u < ue; ++u) {
      KeyedRng rng(o.seed, kWalkTag, static_cast<uint64_t>(u));
      int64_t c = static_cast<int64_t>(rng.below(clusters));
      int32_t* out = items.data() + local[u - ub];
      const int64_t len = local[u - ub + 1] - local[u - ub];
      for (int64_t t = 0; t < len; ++t) {
        if (t > 0) c = cat.next_cluster(c, o.stay, rng);
        out[t] = cat.draw_item(c, rng);
      }
      if ((u & 0xfff) == 0 && progress.due())
        progress.print(std::to_string(u) + "/" + std::to_string(o.users) + " users, " +
                       Progress::rate(prefix[u] / progress.elapsed_s()) + "events/s, ETA " +
                       progress.eta(static_cast<double>(prefix[u]), static_cast<double>(o.events)));
    }
    writer.write_shard(s, o.shards, ShardView{ub, ue, local.data(), items.data(), nullptr, nullptr, 0});
  }
  items = {};

  MetaExtras x;
  std::vector<int64_t> lengths(o.users);
  for (int64_t u = 0; u < o.users; ++u) lengths[u] = prefix[u + 1] - prefix[u];
  add_length_stats(length_stats(std::move(lengths), o.items), x);
  writer.write_meta(meta, x);
  writer.commit();
  progress.print("wrote " + o.out + " (" + std::to_string(o.events) + " events) in " +
                 std::to_string(progress.elapsed_s()).substr(0, 5) + " s");
  return read_meta(o.out);
}

}  // namespace seqrec::io
