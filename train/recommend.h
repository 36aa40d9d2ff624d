#pragma once
// Top-k next-item recommendations from a trained checkpoint: for users of a dataset (each
// after their whole sequence, the valid and test items included) or for a history given item
// by item. Every item 1..N is a candidate (the history's own items too, unless excluded), scored
// as evaluation scores them: the hidden state after the history against the item's output
// representation.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/model.h"

namespace seqrec::dist {
class Comm;
}

namespace seqrec::train {

struct Ranked {
  std::vector<int64_t> items;  // dense ids, best first; ties in score by ascending id
  std::vector<float> scores;   // the model's score of each
};

// One batch: histories[r] (dense item ids 1..N, oldest first, at least one) of the rows whose
// user input is `users` (ids and features, or undefined tensors for an unknown user). The
// model's last max_len items of each are read (max_len - 1 and a [mask] slot under the cloze
// objective). At most k items a row; fewer where exclude_history leaves fewer candidates.
// Throws std::invalid_argument for k < 1 or an item id outside 1..N.
std::vector<Ranked> recommend_batch(models::SequenceModel& model, const std::vector<std::vector<int64_t>>& histories,
                                    const models::UserInput& users, int64_t k, bool exclude_history);

struct RecommendOptions {
  std::string checkpoint;             // a checkpoint directory, or a run's best/ or checkpoints/
  std::string data;                   // "": the dataset the checkpoint was trained on
  std::vector<std::string> users;     // users by their ids in the raw input (dense ids for synth data);
                                      // empty and no history: every user of the dataset
  std::vector<std::string> history;   // an unknown user's items by raw id, oldest first (not with users)
  int64_t k = 10;
  bool exclude_history = false;       // never recommend an item of the user's history
  int64_t batch_users = 64;           // users scored per forward pass
  std::string out;                    // a TSV file written atomically; "": stdout
  std::string device = "cpu";
  std::function<bool()> stop_requested;  // checked between batches: true ends it, nothing written
};

// Loads the checkpoint and writes one header comment naming the checkpoint, dataset, history,
// candidates and k, then "user\trank\titem\tscore" rows with raw ids. One process only.
// Throws std::invalid_argument naming an unknown user or item id, a bad k, or conflicting
// options; nothing is left at `out` on failure.
void run_recommend(const RecommendOptions& options, dist::Comm& comm);

}  // namespace seqrec::train
