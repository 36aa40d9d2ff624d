// prepare_dataset: raw log -> filtered, remapped, chronologically ordered CSR -> shards.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <stdexcept>

#include "io/build_info.h"
#include "io/format.h"
#include "io/loader.h"
#include "io/prepare.h"
#include "io/progress.h"
#include "io/raw_reader.h"
#include "io/user_features.h"
#include "io/writer.h"

namespace seqrec::io {
namespace {

// "ml-1m.txt.xz" -> "ml-1m": the compression suffix and then one extension go.
std::string default_name(const std::string& input) {
  std::filesystem::path p = std::filesystem::path(input).filename();
  const std::string ext = p.extension().string();
  if (ext == ".gz" || ext == ".xz") p = p.stem();
  std::string stem = p.stem().string();
  return stem.empty() ? p.string() : stem;
}

// Iterative k-core on the user-item interaction multigraph (a repeated interaction counts
// again, as in the SASRec/BERT4Rec preprocessing). Degrees are kept exact while rows are
// removed, so every removal is justified by the current graph; the fixed point is the
// unique maximal subgraph in which every user and item has >= k interactions.
struct KcoreResult {
  int64_t removed = 0;
  int passes = 0;  // passes over the rows that removed something
};
KcoreResult kcore_filter(const RawRows& rows, int k, std::vector<uint8_t>& alive) {
  const size_t n = rows.user.size();
  alive.assign(n, 1);
  std::vector<int64_t> udeg(rows.users.size(), 0), ideg(rows.items.size(), 0);
  for (size_t r = 0; r < n; ++r) {
    ++udeg[rows.user[r]];
    ++ideg[rows.item[r]];
  }
  KcoreResult res;
  for (;;) {
    int64_t removed = 0;
    for (size_t r = 0; r < n; ++r) {
      if (!alive[r]) continue;
      const int32_t u = rows.user[r], i = rows.item[r];
      if (udeg[u] < k || ideg[i] < k) {
        alive[r] = 0;
        --udeg[u];
        --ideg[i];
        ++removed;
      }
    }
    if (removed == 0) break;
    res.removed += removed;
    ++res.passes;
  }
  return res;
}

// Dense ids in raw-id order for the table entries that still have rows: dense[index] is
// first_dense + rank, or -1 for entries without rows.
std::vector<int32_t> dense_ids(const IdTable& table, const std::vector<uint8_t>& present, int32_t first_dense) {
  std::vector<int32_t> order;
  for (int32_t i = 0; i < static_cast<int32_t>(present.size()); ++i)
    if (present[i]) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return table.less(a, b); });
  std::vector<int32_t> dense(present.size(), -1);
  for (size_t r = 0; r < order.size(); ++r) dense[order[r]] = first_dense + static_cast<int32_t>(r);
  return dense;
}

RawIdList raw_id_list(const IdTable& table, const std::vector<int32_t>& dense, int32_t first_dense, int64_t count) {
  RawIdList out;
  out.numeric = table.numeric();
  if (out.numeric)
    out.ints.resize(count);
  else
    out.strings.resize(count);
  for (size_t i = 0; i < dense.size(); ++i) {
    if (dense[i] < 0) continue;
    if (out.numeric)
      out.ints[dense[i] - first_dense] = table.ints()[i];
    else
      out.strings[dense[i] - first_dense] = table.strings()[i];
  }
  return out;
}

std::string describe_filters(const PrepareOptions& o) {
  std::string s;
  if (o.has_min_rating) s += "rating >= " + std::to_string(o.min_rating);
  if (!o.behaviors.empty()) {
    s += s.empty() ? "behaviors " : ", behaviors ";
    for (size_t i = 0; i < o.behaviors.size(); ++i) s += (i ? "," : "") + o.behaviors[i];
  }
  if (o.kcore > 0) s += (s.empty() ? "" : ", ") + std::to_string(o.kcore) + "-core";
  return s.empty() ? "none" : s;
}

}  // namespace

DatasetMeta prepare_dataset(const PrepareOptions& o) {
  // Everything that can be checked without reading the input is checked first.
  validate_format_options(o);
  if (o.input.empty()) throw std::runtime_error("input file is not set");
  if (o.shards < 1) throw std::runtime_error("shards must be >= 1, got " + std::to_string(o.shards));
  if (o.kcore < 0) throw std::runtime_error("kcore must be >= 0, got " + std::to_string(o.kcore));
  if (!o.user_id_map.empty() && o.user_features.empty())
    throw std::runtime_error("user_id_map only joins user_features; set user_features too");
  check_output_dir(o.out);
  Progress progress(o.progress, "prepare");

  UserFeatureTable features;
  std::unordered_map<std::string, std::string> id_map;
  if (!o.user_features.empty()) features = read_ml1m_user_features(o.user_features);
  if (!o.user_id_map.empty()) id_map = read_id_map(o.user_id_map);

  RawRows rows = read_raw(o);
  const int64_t rows_kept = static_cast<int64_t>(rows.user.size());

  std::vector<uint8_t> alive;
  KcoreResult kc;
  if (o.kcore > 0) {
    kc = kcore_filter(rows, o.kcore, alive);
    progress.print(std::to_string(o.kcore) + "-core: removed " + std::to_string(kc.removed) + " rows in " +
                   std::to_string(kc.passes) + (kc.passes == 1 ? " pass" : " passes"));
  }
  auto is_alive = [&](size_t r) { return alive.empty() || alive[r]; };

  // Dense ids: users 0..U-1 and items 1..N, both in raw-id order (for files whose ids are
  // already dense, such as SASRec's ml-1m.txt, dense ids equal the file's ids).
  std::vector<uint8_t> user_present(rows.users.size(), 0), item_present(rows.items.size(), 0);
  int64_t events = 0;
  for (size_t r = 0; r < rows.user.size(); ++r)
    if (is_alive(r)) {
      user_present[rows.user[r]] = 1;
      item_present[rows.item[r]] = 1;
      ++events;
    }
  if (events == 0)
    throw std::runtime_error(o.input + ": no interactions left after filtering (" + describe_filters(o) + "; " +
                             std::to_string(rows.rows_read) + " rows read)");
  const std::vector<int32_t> user_dense = dense_ids(rows.users, user_present, 0);
  const std::vector<int32_t> item_dense = dense_ids(rows.items, item_present, 1);
  const int64_t U = std::count(user_present.begin(), user_present.end(), 1);
  const int64_t N = std::count(item_present.begin(), item_present.end(), 1);
  user_present = {};
  item_present = {};

  // CSR by a counting sort on the dense user: stable, so each user's rows keep file order.
  std::vector<int64_t> offsets(U + 1, 0);
  for (size_t r = 0; r < rows.user.size(); ++r)
    if (is_alive(r)) ++offsets[user_dense[rows.user[r]] + 1];
  std::partial_sum(offsets.begin(), offsets.end(), offsets.begin());
  std::vector<int32_t> items(events);
  std::vector<int64_t> times(rows.has_timestamps ? events : 0);
  {
    std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
    for (size_t r = 0; r < rows.user.size(); ++r) {
      if (!is_alive(r)) continue;
      const int64_t at = next[user_dense[rows.user[r]]]++;
      items[at] = item_dense[rows.item[r]];
      if (rows.has_timestamps) times[at] = rows.time[r];
    }
  }
  rows.user = {};
  rows.item = {};
  rows.time = {};
  alive = {};

  // Chronological within each user; stable, so equal timestamps stay in file order.
  int64_t time_min = 0, time_max = 0;
  if (rows.has_timestamps) {
    time_min = *std::min_element(times.begin(), times.end());
    time_max = *std::max_element(times.begin(), times.end());
    std::vector<std::pair<int64_t, int32_t>> buf;
    for (int64_t u = 0; u < U; ++u) {
      const int64_t b = offsets[u], e = offsets[u + 1];
      if (std::is_sorted(times.begin() + b, times.begin() + e)) continue;
      buf.clear();
      for (int64_t j = b; j < e; ++j) buf.emplace_back(times[j], items[j]);
      std::stable_sort(buf.begin(), buf.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      for (int64_t j = b; j < e; ++j) {
        times[j] = buf[j - b].first;
        items[j] = buf[j - b].second;
      }
    }
  }

  // User features, joined by raw user id (through the id map when given).
  const int64_t F = static_cast<int64_t>(features.names.size());
  std::vector<int32_t> user_codes(U * F, 0);
  int64_t missing = 0;
  if (F > 0) {
    for (size_t idx = 0; idx < user_dense.size(); ++idx) {
      const int32_t u = user_dense[idx];
      if (u < 0) continue;
      std::string key = canonical_id(rows.users.text(static_cast<int32_t>(idx)));
      if (!id_map.empty()) {
        auto m = id_map.find(key);
        key = m == id_map.end() ? std::string() : m->second;
      }
      auto it = key.empty() ? features.codes.end() : features.codes.find(key);
      if (it == features.codes.end()) {
        ++missing;
        continue;
      }
      std::copy(it->second.begin(), it->second.end(), user_codes.begin() + u * F);
    }
    if (missing == U)
      throw std::runtime_error(o.user_features + ": none of the dataset's " + std::to_string(U) +
                               " users has features there" +
                               (o.user_id_map.empty() ? " (do its ids need user_id_map?)" : " (wrong user_id_map?)"));
    if (missing > 0)
      std::fprintf(stderr, "[prepare] warning: %lld of %lld users have no row in %s; their features are 0 (unknown)\n",
                   static_cast<long long>(missing), static_cast<long long>(U), o.user_features.c_str());
  }

  DatasetMeta meta;
  meta.name = o.name.empty() ? default_name(o.input) : o.name;
  meta.source_format = o.format;
  meta.source_checksum = rows.checksum;
  meta.num_users = U;
  meta.num_items = N;
  meta.num_events = events;
  meta.num_shards = o.shards;
  meta.has_timestamps = rows.has_timestamps;
  meta.shard_user_begin = split_users_by_events(offsets, o.shards);
  meta.user_feature_names = features.names;
  for (const auto& v : features.values) meta.user_feature_cardinalities.push_back(static_cast<int64_t>(v.size()));
  auto& a = meta.attributes;
  a["created_by"] = "seqrec prepare, " + describe_build();
  a["input"] = o.input;
  a["filters"] = describe_filters(o);
  a["order"] = rows.has_timestamps ? "chronological per user; equal timestamps keep file order" : "file order per user";
  a["dense_ids"] = "users 0..U-1 and items 1..N in raw-id order (numeric, or bytewise for string ids); item 0 = padding";
  a["split"] = kSplitRule;
  if (o.format == "generic") {
    std::string cols;
    for (const auto& c : o.columns) cols += (cols.empty() ? "" : ",") + c;
    a["columns"] = cols;
  }
  if (F > 0) a["user_features_source"] = o.user_features;
  if (!o.user_id_map.empty()) a["user_id_map"] = o.user_id_map;

  MetaExtras x;
  x.has_raw_ids = true;
  x.user_raw_ids = raw_id_list(rows.users, user_dense, 0, U);
  x.item_raw_ids = raw_id_list(rows.items, item_dense, 1, N);
  x.user_feature_values = features.values;
  x.int_stats = {{"rows_read", rows.rows_read}, {"rows_after_row_filters", rows_kept}};
  for (const auto& c : rows.counts) x.int_stats.push_back(c);
  if (o.kcore > 0) {
    x.int_stats.emplace_back("rows_removed_by_kcore", kc.removed);
    x.int_stats.emplace_back("kcore_passes", kc.passes);
  }
  if (rows.has_timestamps) {
    x.int_stats.emplace_back("time_min", time_min);
    x.int_stats.emplace_back("time_max", time_max);
  }
  if (F > 0) x.int_stats.emplace_back("users_without_features", missing);
  std::vector<int64_t> lengths(U);
  for (int64_t u = 0; u < U; ++u) lengths[u] = offsets[u + 1] - offsets[u];
  add_length_stats(length_stats(std::move(lengths), N), x);

  DatasetWriter writer(o.out);
  std::vector<int64_t> local;
  for (int64_t s = 0; s < o.shards; ++s) {
    const int64_t ub = meta.shard_user_begin[s], ue = meta.shard_user_begin[s + 1];
    local.assign(offsets.begin() + ub, offsets.begin() + ue + 1);
    for (auto& v : local) v -= offsets[ub];
    ShardView view{ub, ue, local.data(), items.data() + offsets[ub],
                   rows.has_timestamps ? times.data() + offsets[ub] : nullptr,
                   F > 0 ? user_codes.data() + ub * F : nullptr, F};
    writer.write_shard(s, o.shards, view);
  }
  writer.write_meta(meta, x);
  writer.commit();
  progress.print("wrote " + o.out + " (" + std::to_string(U) + " users, " + std::to_string(N) + " items, " +
                 std::to_string(events) + " events, " + std::to_string(o.shards) + " shards) in " +
                 std::to_string(progress.elapsed_s()).substr(0, 5) + " s");
  return read_meta(o.out);
}

}  // namespace seqrec::io
