#pragma once
// Pieces of the dataset-directory format shared by the writers (prepare, synth) and the
// reader (dataset.cpp): file names, the shard checksum, the user split and the statistics.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace seqrec::io {

inline constexpr const char* kMetaFile = "meta.h5";

// shard-00002-of-00004.h5
std::string shard_file_name(int64_t shard, int64_t num_shards);

// One shard's arrays; offsets are local (offsets[0] == 0, size num_users + 1).
struct ShardView {
  int64_t user_begin = 0;
  int64_t user_end = 0;
  const int64_t* offsets = nullptr;
  const int32_t* items = nullptr;
  const int64_t* timestamps = nullptr;     // null when the dataset has none
  const int32_t* user_features = nullptr;  // [num_users, num_features] or null
  int64_t num_features = 0;

  int64_t num_users() const { return user_end - user_begin; }
  int64_t num_events() const { return offsets[num_users()]; }
};

// crc32 (zlib) over the bytes of offsets, items, timestamps and user features in that order,
// as little-endian values in memory. HDF5 keeps no checksum of raw data, so this is what
// catches a flipped bit in a shard.
uint32_t shard_checksum(const ShardView& shard);

// Splits users [0, U) into `shards` contiguous ranges of about equal event counts, given the
// prefix sums of the sequence lengths (size U + 1). Returns the S + 1 boundaries. Every
// shard gets at least one user when U >= S.
std::vector<int64_t> split_users_by_events(const std::vector<int64_t>& prefix, int64_t shards);

// Statistics over sequence lengths: min, median, mean, max and density (events / users·items).
struct LengthStats {
  int64_t users = 0, events = 0, min = 0, max = 0;
  double median = 0, mean = 0, density = 0;
};
LengthStats length_stats(std::vector<int64_t> lengths, int64_t num_items);

}  // namespace seqrec::io
