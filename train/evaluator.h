#pragma once
// Leave-one-out evaluation under a named protocol: full ranking over all items, or 1 target
// + N sampled negatives (uniform or popularity-proportional, never in the user's sequence).
// Ties count against the target (pessimistic rank). Users are scored many per forward pass.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "models/model.h"

namespace seqrec::dist {
class Comm;
}

namespace seqrec::train {

enum class Split { kValid, kTest };
const char* split_name(Split s);

struct EvalProtocol {
  bool sampled = true;            // false: full ranking over items 1..num_items
  int64_t negatives = 100;        // sampled only
  bool popularity = false;        // sampled only: negatives proportional to training counts
  bool exclude_history = false;   // full only: the user's history items are not ranked
  std::string describe() const;   // e.g. "sampled: 1 target + 100 uniform negatives not in the user's sequence"
  std::string key() const;        // short id: "sampled100-uniform", "full", "full-exclude-history"
};

struct EvalOptions {
  int64_t max_len = 200;
  int64_t batch_users = 64;  // small batches keep the [B, L, L] attention in cache
  uint64_t seed = 42;
  std::vector<int> ks{5, 10, 20};
  // Every rank runs the same number of forward passes (empty ones when it has fewer users):
  // for models with collectives inside forward (the mixture of experts across ranks).
  bool lockstep = false;
};

struct EvalResult {
  Split split = Split::kValid;
  EvalProtocol protocol;
  int64_t users = 0;                      // evaluated users, all ranks
  // HR@k, NDCG@k, MRR@k, MRR, and "tied": the fraction of users whose target's score equals
  // another candidate's (ranked below all of them: ties count against the target).
  std::map<std::string, double> metrics;
  double seconds = 0;
  double get(const std::string& name) const;  // throws naming the metric
};

// Training-item counts over all ranks (index = item id), for popularity negatives.
std::vector<double> item_popularity(const io::UserSequences& seqs, const io::DatasetMeta& meta,
                                    dist::Comm& comm);

// Throws std::invalid_argument when `protocol` cannot be run on the dataset (more sampled
// negatives than items); evaluate() checks it too, the trainer before its first step.
void check_protocol(const EvalProtocol& protocol, const io::DatasetMeta& meta);

// Collective over `comm`: each rank scores the users it owns; sums are all-reduced.
EvalResult evaluate(models::SequenceModel& model, const io::UserSequences& seqs,
                    const io::DatasetMeta& meta, Split split, const EvalProtocol& protocol,
                    const EvalOptions& options, dist::Comm& comm,
                    const std::vector<double>* popularity = nullptr);

// The rows' users as the models read them: their ids and, when the dataset has user features,
// their feature codes ([n, F], from this rank's shard range, which must hold every id).
models::UserInput user_input(const at::Tensor& ids, const io::UserSequences& seqs, const io::DatasetMeta& meta);
// The same rows' tensors on `device` (no copy where they already are).
models::UserInput on_device(models::UserInput users, const at::Device& device);

// Rank of the target (1 = best) among candidates; ties count against the target.
// scores[0] is the target; returns 1 + #{j > 0 : scores[j] >= scores[0]}.
int64_t pessimistic_rank(const float* scores, int64_t n);

// Adds HR/NDCG/MRR at each k (and untruncated MRR) for one user's rank to `sums`.
void accumulate_rank(int64_t rank, const std::vector<int>& ks, std::map<std::string, double>& sums);

// One line: "dataset=ml-1m split=test protocol=... tie=pessimistic users=6040 HR@10=..."
std::string format_result(const EvalResult& r, const std::string& dataset, int64_t epoch);
// One JSON object (no newline) with the same fields.
std::string result_json(const EvalResult& r, const std::string& dataset, int64_t epoch, int64_t step);

}  // namespace seqrec::train
