#pragma once
// The dataset directory contract (DESIGN.md): meta.h5 + shard-XXXXX-of-YYYYY.h5 holding
// users' chronologically ordered sequences in CSR form. Dense ids: users 0..num_users-1
// in shard order, items 1..num_items (0 = padding).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace seqrec::io {

inline constexpr int kFormatVersion = 1;

struct DatasetMeta {
  std::string name;             // e.g. "ml-1m" (from the input file name or --name)
  std::string source_format;    // sasrec | ml-1m | ml-25m | taobao | generic | synth
  std::string source_checksum;  // sha256 of the raw input bytes (decompressed), "" for synth
  int format_version = kFormatVersion;
  int64_t num_users = 0;
  int64_t num_items = 0;   // largest dense item id; the embedding table has num_items + 1 rows
  int64_t num_events = 0;
  int64_t num_shards = 0;
  bool has_timestamps = false;
  // shard_user_begin[s] is the first dense user of shard s; size num_shards + 1.
  std::vector<int64_t> shard_user_begin;
  // Per shard: crc32 of its arrays (verified by load_shards) and its number of events.
  std::vector<uint32_t> shard_checksums;
  std::vector<int64_t> shard_num_events;
  // Optional categorical user features (e.g. gender, age, occupation, zip prefix for
  // ML-1M). Values are dense codes 1..cardinality, 0 = unknown.
  std::vector<std::string> user_feature_names;
  std::vector<int64_t> user_feature_cardinalities;
  // Free-form provenance (written to meta.h5's /attributes group) and, after read_meta,
  // also the statistics of its /stats group (seq_len_mean, density, ...) as text. Printed
  // by `seqrec info`.
  std::map<std::string, std::string> attributes;
};

// The sequences of a contiguous range of users [user_begin, user_end), CSR.
struct UserSequences {
  int64_t user_begin = 0;
  int64_t user_end = 0;
  std::vector<int64_t> offsets{0};   // size (user_end - user_begin) + 1
  std::vector<int32_t> items;        // dense item ids, chronological per user
  std::vector<int64_t> timestamps;   // empty when the dataset has none
  // user features, row-major [num_users_in_range, num_features]; empty when none
  std::vector<int32_t> user_features;

  int64_t num_users() const { return user_end - user_begin; }
  bool owns(int64_t user) const { return user >= user_begin && user < user_end; }
  int64_t length(int64_t user) const {
    return offsets[user - user_begin + 1] - offsets[user - user_begin];
  }
  const int32_t* items_of(int64_t user) const {
    return items.data() + offsets[user - user_begin];
  }
};

// Reads and validates meta.h5; throws std::runtime_error naming the file and problem
// (missing, not HDF5, format version mismatch, inconsistent counts).
DatasetMeta read_meta(const std::string& dir);

// Shards owned by `rank` out of `world`: a contiguous block, [first, last) =
// [rank*S/world, (rank+1)*S/world). When world > S some ranks own none (first == last).
std::pair<int64_t, int64_t> owned_shards(int64_t num_shards, int rank, int world);

// Loads (and validates: checksums, counts, id ranges) the shards `rank` owns. The users
// of those shards form one contiguous range; a rank that owns no shard gets the empty
// range user_begin == user_end == shard_user_begin[first]. Throws std::runtime_error
// naming the shard and the problem (missing, truncated, corrupt, shard-count mismatch),
// std::invalid_argument for a bad rank/world or a meta not obtained from read_meta.
UserSequences load_shards(const std::string& dir, const DatasetMeta& meta, int rank, int world);

// The raw ids of the dense users (index u) or items (index i - 1, item 0 being padding) as
// text; `which` is "user" or "item". Empty for datasets without raw ids (synth).
std::vector<std::string> read_raw_ids(const std::string& dir, const std::string& which);

}  // namespace seqrec::io
