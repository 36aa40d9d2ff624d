#pragma once
// Writes a dataset directory atomically: everything goes into <out>.tmp-XXXXXX beside
// <out>, files are fsynced, and the directory is renamed to <out> only when complete. A
// writer destroyed before commit() removes its temp dir, so an error or an exception never
// leaves a half-written dataset where a later run would take it for a good one.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "io/dataset.h"
#include "io/format.h"

namespace seqrec::io {

// Raw ids of dense users (index u) or items (index i - 1): integers when every raw id
// was a plain integer, otherwise strings.
struct RawIdList {
  bool numeric = true;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
};

struct MetaExtras {
  bool has_raw_ids = false;
  RawIdList user_raw_ids, item_raw_ids;
  // Per user feature: the raw value of code c at index c - 1.
  std::vector<std::vector<std::string>> user_feature_values;
  // Numbers for the /stats group (statistics of the prepared data).
  std::vector<std::pair<std::string, int64_t>> int_stats;
  std::vector<std::pair<std::string, double>> real_stats;
};

class DatasetWriter {
 public:
  // Fails (std::runtime_error) when `out` exists and is not an empty directory.
  explicit DatasetWriter(const std::string& out);
  ~DatasetWriter();
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  // Writes shard `index` of `num_shards`; remembers its checksum and event count for meta.
  void write_shard(int64_t index, int64_t num_shards, const ShardView& shard);
  // Writes meta.h5. meta.shard_checksums / shard_num_events are filled from the shards
  // written so far, which must be all of them.
  void write_meta(DatasetMeta& meta, const MetaExtras& extras);
  // fsync, rename to `out`.
  void commit();

  const std::string& temp_dir() const { return tmp_; }

 private:
  std::string out_, tmp_;
  bool committed_ = false;
  std::vector<uint32_t> checksums_;
  std::vector<int64_t> events_;
};

// Fails unless `out` is absent or an empty directory (checked before any work is done).
void check_output_dir(const std::string& out);

// Adds the sequence-length statistics to extras.*_stats.
void add_length_stats(const LengthStats& st, MetaExtras& extras);

}  // namespace seqrec::io
