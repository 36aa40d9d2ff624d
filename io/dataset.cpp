// Reading and describing a dataset directory (the contract in dataset.h).
#include "io/dataset.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>
#include <stdexcept>

#include "io/format.h"
#include "io/h5.h"
#include "io/prepare.h"

namespace seqrec::io {
namespace fs = std::filesystem;
namespace {

std::string join(const std::string& dir, const std::string& file) { return (fs::path(dir) / file).string(); }

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08" PRIx32, v);
  return buf;
}

}  // namespace

DatasetMeta read_meta(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw std::runtime_error(dir + ": no such dataset directory");
  const std::string path = join(dir, kMetaFile);
  h5::File f = h5::File::open(path, "not a dataset directory? create one with 'seqrec prepare' or 'seqrec synth'");
  const hid_t r = f.root();
  DatasetMeta m;
  const int64_t version = f.attr_int(r, "format_version");
  if (version != kFormatVersion)
    bad(path, "format version mismatch: the file has version " + std::to_string(version) + ", this build reads version " +
                  std::to_string(kFormatVersion) + " (prepare the dataset again with this build)");
  m.format_version = static_cast<int>(version);
  m.name = f.attr_string(r, "name");
  m.source_format = f.attr_string(r, "source_format");
  m.source_checksum = f.attr_string(r, "source_checksum");
  m.num_users = f.attr_int(r, "num_users");
  m.num_items = f.attr_int(r, "num_items");
  m.num_events = f.attr_int(r, "num_events");
  m.num_shards = f.attr_int(r, "num_shards");
  m.has_timestamps = f.attr_int(r, "has_timestamps") != 0;
  if (m.num_users < 0 || m.num_items < 0 || m.num_events < 0 || m.num_shards < 1)
    bad(path, "inconsistent counts: users " + std::to_string(m.num_users) + ", items " + std::to_string(m.num_items) +
                  ", events " + std::to_string(m.num_events) + ", shards " + std::to_string(m.num_shards));

  m.shard_user_begin = f.read<int64_t>(r, "shard_user_begin");
  m.shard_checksums = f.read<uint32_t>(r, "shard_checksums");
  m.shard_num_events = f.read<int64_t>(r, "shard_num_events");
  const size_t S = static_cast<size_t>(m.num_shards);
  if (m.shard_user_begin.size() != S + 1 || m.shard_checksums.size() != S || m.shard_num_events.size() != S)
    bad(path, "shard tables do not match num_shards = " + std::to_string(m.num_shards));
  if (m.shard_user_begin.front() != 0 || m.shard_user_begin.back() != m.num_users ||
      !std::is_sorted(m.shard_user_begin.begin(), m.shard_user_begin.end()))
    bad(path, "shard_user_begin must rise from 0 to num_users = " + std::to_string(m.num_users));
  int64_t events = 0;
  for (int64_t e : m.shard_num_events) events += e;
  if (events != m.num_events)
    bad(path, "shard event counts sum to " + std::to_string(events) + ", num_events is " + std::to_string(m.num_events));

  m.user_feature_names = f.read_strings(r, "user_feature_names");
  m.user_feature_cardinalities = f.read<int64_t>(r, "user_feature_cardinalities");
  if (m.user_feature_names.size() != m.user_feature_cardinalities.size())
    bad(path, "user_feature_names and user_feature_cardinalities differ in length");
  for (int64_t c : m.user_feature_cardinalities)
    if (c < 1) bad(path, "a user feature cardinality is < 1");

  for (const char* group : {"attributes", "stats"}) {
    if (!f.has(r, group)) continue;
    h5::Object g = f.open_group(group);
    for (auto& [k, v] : f.attrs_as_text(g.id())) m.attributes[k] = v;
  }
  return m;
}

std::pair<int64_t, int64_t> owned_shards(int64_t num_shards, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world)
    throw std::invalid_argument("owned_shards: rank " + std::to_string(rank) + " out of world " + std::to_string(world));
  return {num_shards * rank / world, num_shards * (rank + 1) / world};
}

UserSequences load_shards(const std::string& dir, const DatasetMeta& meta, int rank, int world) {
  const int64_t S = meta.num_shards;
  if (meta.shard_user_begin.size() != static_cast<size_t>(S + 1) || meta.shard_checksums.size() != static_cast<size_t>(S) ||
      meta.shard_num_events.size() != static_cast<size_t>(S))
    throw std::invalid_argument("load_shards: meta lacks the shard tables; obtain it from read_meta");
  const auto [first, last] = owned_shards(S, rank, world);
  const int64_t F = static_cast<int64_t>(meta.user_feature_names.size());

  UserSequences out;
  out.user_begin = meta.shard_user_begin[first];
  out.user_end = meta.shard_user_begin[last];
  int64_t total = 0;
  for (int64_t s = first; s < last; ++s) total += meta.shard_num_events[s];
  // Sized once and read in place: no second copy of the largest arrays.
  out.offsets.assign(1, 0);
  out.offsets.reserve(out.num_users() + 1);
  out.items.resize(total);
  if (meta.has_timestamps) out.timestamps.resize(total);
  if (F > 0) out.user_features.resize(out.num_users() * F);

  int64_t pos = 0;
  std::vector<int64_t> local;
  for (int64_t s = first; s < last; ++s) {
    const std::string path = join(dir, shard_file_name(s, S));
    h5::File f = h5::File::open(path, "meta.h5 lists " + std::to_string(S) + " shards");
    const hid_t r = f.root();
    const int64_t version = f.attr_int(r, "format_version");
    if (version != kFormatVersion)
      bad(path, "format version mismatch: shard has version " + std::to_string(version) + ", this build reads " +
                    std::to_string(kFormatVersion));
    const int64_t shard_count = f.attr_int(r, "num_shards"), index = f.attr_int(r, "shard_index");
    if (shard_count != S || index != s)
      bad(path, "shard-count mismatch: the file is shard " + std::to_string(index) + " of " + std::to_string(shard_count) +
                    ", meta.h5 expects shard " + std::to_string(s) + " of " + std::to_string(S) +
                    " (shards from another preparation?)");
    const int64_t ub = f.attr_int(r, "user_begin"), ue = f.attr_int(r, "user_end");
    if (ub != meta.shard_user_begin[s] || ue != meta.shard_user_begin[s + 1])
      bad(path, "user range [" + std::to_string(ub) + ", " + std::to_string(ue) + ") differs from meta.h5's [" +
                    std::to_string(meta.shard_user_begin[s]) + ", " + std::to_string(meta.shard_user_begin[s + 1]) + ")");
    const int64_t n = ue - ub, events = meta.shard_num_events[s];

    local.resize(n + 1);
    f.read(r, "offsets", local.data(), local.size());
    if (local[0] != 0) bad(path, "offsets must start at 0, found " + std::to_string(local[0]));
    for (int64_t i = 0; i < n; ++i)
      if (local[i + 1] < local[i])
        bad(path, "offsets are not monotone at user " + std::to_string(ub + i) + " (" + std::to_string(local[i]) + " then " +
                      std::to_string(local[i + 1]) + ")");
    if (local[n] != events)
      bad(path, "offsets end at " + std::to_string(local[n]) + " but meta.h5 lists " + std::to_string(events) + " events");

    int32_t* items = out.items.data() + pos;
    f.read(r, "items", items, events);
    for (int64_t i = 0; i < events; ++i)
      if (items[i] < 1 || items[i] > meta.num_items) {
        const int64_t user = ub + (std::upper_bound(local.begin(), local.end(), i) - local.begin()) - 1;
        bad(path, "item id " + std::to_string(items[i]) + " out of range [1, " + std::to_string(meta.num_items) +
                      "] (user " + std::to_string(user) + ", position " + std::to_string(i - local[user - ub]) + ")");
      }
    int64_t* times = nullptr;
    if (meta.has_timestamps) {
      times = out.timestamps.data() + pos;
      f.read(r, "timestamps", times, events);
    } else if (f.has(r, "timestamps")) {
      bad(path, "has timestamps but meta.h5 says the dataset has none");
    }
    int32_t* features = nullptr;
    if (F > 0) {
      features = out.user_features.data() + (ub - out.user_begin) * F;
      const auto d = f.dims(r, "user_features");
      if (d.size() != 2 || static_cast<int64_t>(d[0]) != n || static_cast<int64_t>(d[1]) != F)
        bad(path, "user_features must have shape [" + std::to_string(n) + ", " + std::to_string(F) + "]");
      f.read(r, "user_features", features, n * F);
      for (int64_t i = 0; i < n * F; ++i)
        if (features[i] < 0 || features[i] > meta.user_feature_cardinalities[i % F])
          bad(path, "user feature '" + meta.user_feature_names[i % F] + "' code " + std::to_string(features[i]) +
                        " out of range [0, " + std::to_string(meta.user_feature_cardinalities[i % F]) + "]");
    }

    ShardView view{ub, ue, local.data(), items, times, features, F};
    const uint32_t crc = shard_checksum(view);
    if (crc != meta.shard_checksums[s])
      bad(path, "checksum mismatch: the data has crc32 " + hex32(crc) + ", meta.h5 records " + hex32(meta.shard_checksums[s]) +
                    " (corrupt shard: prepare the dataset again)");

    for (int64_t i = 1; i <= n; ++i) out.offsets.push_back(pos + local[i]);
    pos += events;
  }
  return out;
}

std::vector<std::string> read_raw_ids(const std::string& dir, const std::string& which) {
  if (which != "user" && which != "item")
    throw std::invalid_argument("read_raw_ids: which must be 'user' or 'item', got '" + which + "'");
  h5::File f = h5::File::open(join(dir, kMetaFile));
  const std::string name = which + "_raw_ids";
  if (!f.has(f.root(), name)) return {};
  if (f.is_string_dataset(f.root(), name)) return f.read_strings(f.root(), name);
  std::vector<std::string> out;
  for (int64_t v : f.read<int64_t>(f.root(), name)) out.push_back(std::to_string(v));
  return out;
}

std::string describe(const DatasetMeta& m) {
  std::ostringstream o;
  auto attr = [&](const std::string& k) {
    auto it = m.attributes.find(k);
    return it == m.attributes.end() ? std::string("?") : it->second;
  };
  o << "dataset '" << m.name << "' (source format " << m.source_format << ", format version " << m.format_version << ")\n";
  o << "  users " << m.num_users << ", items " << m.num_items << " (ids 1.." << m.num_items << ", 0 = padding), events "
    << m.num_events << "\n";
  std::set<std::string> shown = {"seq_len_min", "seq_len_median", "seq_len_mean", "seq_len_max", "density"};
  o << "  sequence length: min " << attr("seq_len_min") << ", median " << attr("seq_len_median") << ", mean "
    << attr("seq_len_mean") << ", max " << attr("seq_len_max") << "; density " << attr("density") << "\n";
  o << "  timestamps: " << (m.has_timestamps ? "yes" : "no") << "\n";
  o << "  user features: ";
  if (m.user_feature_names.empty()) o << "none";
  for (size_t i = 0; i < m.user_feature_names.size(); ++i)
    o << (i ? ", " : "") << m.user_feature_names[i] << " (" << m.user_feature_cardinalities[i] << " values)";
  o << "\n  shards: " << m.num_shards;
  const int64_t listed = std::min<int64_t>(m.num_shards, 8);
  for (int64_t s = 0; s < listed && s + 1 < static_cast<int64_t>(m.shard_user_begin.size()); ++s) {
    o << (s ? "; " : " (") << "users [" << m.shard_user_begin[s] << ", " << m.shard_user_begin[s + 1] << ")";
    if (s < static_cast<int64_t>(m.shard_num_events.size())) o << " " << m.shard_num_events[s] << " events";
  }
  if (m.num_shards > listed) o << "; ...";
  if (listed > 0 && !m.shard_user_begin.empty()) o << ")";
  o << "\n";
  if (!m.source_checksum.empty()) o << "  source sha256: " << m.source_checksum << "\n";
  for (const auto& [k, v] : m.attributes)
    if (!shown.count(k)) o << "  " << k << ": " << v << "\n";
  return o.str();
}

}  // namespace seqrec::io
