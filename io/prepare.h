#pragma once
// Raw interaction logs -> dataset directory, and the synthetic generator.
#include <cstdint>
#include <string>
#include <vector>

#include "io/dataset.h"

namespace seqrec::io {

// Dense ids: users 0..U-1 and items 1..N, both in raw-id order (numeric; bytewise for
// string ids of the generic format), so files whose ids are already dense (SASRec's
// ml-1m.txt) keep them. Each user's events are chronological, equal timestamps (and
// formats without timestamps) in file order. The raw->dense maps are stored in meta.h5.
struct PrepareOptions {
  std::string format;   // sasrec | ml-1m | ml-20m | ml-25m | taobao | generic
  std::string input;    // plain, .gz or .xz
  std::string out;      // dataset directory (must not exist or be empty)
  std::string name;     // dataset name; default: input file stem
  int64_t shards = 1;
  int kcore = 0;                         // iterative k-core on users and items (repeated
                                         // interactions count); 0 = off
  bool has_min_rating = false;
  double min_rating = 0;                 // keep rows with rating >= min_rating
  std::vector<std::string> behaviors;    // taobao: keep only these (pv, buy, cart, fav)
  std::vector<std::string> columns;      // generic: e.g. {"user","item","time","rating","ignore"};
                                         // ids may be any text, time must be an integer
  char delimiter = ',';                  // generic
  bool header = false;                   // generic
  std::string user_features;             // ml-1m users.dat path (optional, any format): gender,
                                         // age, occupation, zip prefix as codes 1..card, 0 unknown
  std::string user_id_map;               // "dataset_id original_id" per line (optional)
  bool progress = true;                  // rows/s and ETA on stderr
};

// Throws std::runtime_error naming file, line and field for malformed input. Writes into
// <out>.tmp-XXXX and renames to <out> only when complete, so no half-written dataset is
// ever left where a later run would take it for a good one.
DatasetMeta prepare_dataset(const PrepareOptions& options);

struct SynthOptions {
  std::string out;
  int64_t users = 1000;
  int64_t items = 500;
  int64_t events = 50000;   // total, spread over users (each user >= 3 events)
  uint64_t seed = 1;
  int64_t shards = 1;
  int clusters = 0;         // item clusters with Markov transitions; 0 = sqrt(items)
  double zipf = 1.0;        // item popularity exponent within a cluster
  double stay = 0.8;        // probability that the next item's cluster follows the Markov chain
                            // (one of 3 likely successors); otherwise a uniformly random cluster
  bool progress = true;
};

// Deterministic in the seed and independent of the shard count; streams (one shard of
// events in memory). Same atomic write as prepare_dataset.
DatasetMeta synth_dataset(const SynthOptions& options);

// Human-readable description of a dataset (counts, statistics, provenance, shards).
std::string describe(const DatasetMeta& meta);

}  // namespace seqrec::io
