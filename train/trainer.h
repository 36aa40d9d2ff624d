#pragma once
// The training job: data-parallel next-item training with periodic validation, early
// stopping, atomic checkpoints with exact resume, and one final test evaluation of the
// model selected on the validation split.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "io/loader.h"
#include "models/model.h"
#include "train/evaluator.h"
#include "train/optimizer.h"

namespace seqrec::dist {
class Comm;
}

namespace seqrec::train {

struct TrainOptions {
  std::string data;                 // dataset directory
  std::string out;                  // run directory
  models::ModelOptions model;       // num_items is filled from the dataset
  io::LoaderOptions loader;
  std::string allocator;            // which heap allocator serves the process, for the [setup] log
  std::string device = "cpu";       // cpu | cuda | cuda:N (one rank per process; see train/device.h)
  std::string loss = "bce";         // bce (1 negative per position) | ce (softmax over all items) |
                                    // sampled (softmax over the target and loss_negatives drawn items)
  int64_t loss_negatives = 1000;    // sampled: items drawn per step, shared by its targets
  std::string loss_sampler = "uniform";  // sampled: uniform | popularity (training count + 1)
  double label_smoothing = 0;       // ce: each target's 1 becomes 1 - eps, and eps is spread evenly over the N items
  double mask_prob = 0.2;           // cloze objective: probability that a training item is masked
  AdamOptions adam;
  double clip_norm = 0;             // 0 = no clipping
  int64_t length_groups = 0;        // rows of a batch run in this many length-sorted, trimmed slices;
                                    // 0: 8 on the CPU, 1 on a CUDA device (each slice's launches cost more there)
  int64_t softmax_keep_mib = 256;   // --loss ce keeps a batch's probabilities for the backward up to this size
  int64_t warmup_steps = 0;         // linear LR warm-up
  std::string lr_schedule = "constant";  // after the warm-up: constant | cosine | linear decay
  double lr_final_ratio = 0.0;      // cosine/linear: the lr at the last planned step, as a fraction of lr
  int64_t lr_decay_from_epoch = 0;  // cosine/linear: the decay begins here (0: at the warm-up's end)
  int64_t epochs = 200;
  int64_t eval_every = 1;           // validate every N epochs
  int64_t patience = 0;             // stop after N validations without improvement; 0 = never
  std::string select_metric = "NDCG@10";
  EvalProtocol select_protocol;     // the protocol model selection uses
  bool also_full_ranking = true;    // report full-ranking metrics beside the sampled ones
  EvalOptions eval;
  std::string resume;               // "" (fresh; error if checkpoints exist), "auto", or a checkpoint dir
  int64_t checkpoint_every = 0;     // steps; 0 = at each validation
  int keep_checkpoints = 3;
  int expert_parallel = 1;          // ranks per expert-parallel group (divides the world size)
  int64_t replica_check_every = 100;  // steps between cross-rank equality checks of the model
                                      // state (also before every checkpoint); 0 = checkpoints only
  int64_t max_steps = 0;            // stop after this many optimizer steps in total; 0 = no limit
  bool final_test = true;           // evaluate the selected model on the test split at the end
  double log_every_seconds = 10;
  int64_t profile_steps = 0;        // profile this many training steps of the sitting (0 = none)
  int64_t profile_after = 5;        // ... after this many (warm-up: caches, allocator, BLAS buffers)
  uint64_t seed = 42;               // dropout stream (per rank) and evaluation negatives
  std::string config_text;          // the effective flags, checked identical on every rank
  std::function<bool()> stop_requested;  // e.g. set by SIGTERM/SIGUSR1: checkpoint and stop
};

struct TrainSummary {
  int64_t steps = 0;
  int64_t epochs_completed = 0;
  int64_t best_epoch = -1;
  double best_valid = 0;
  bool stopped_by_signal = false;
  double seconds_per_epoch = 0;
  double peak_rss_mib = 0;  // peak resident memory of this sitting, the largest over the ranks
  double peak_device_mib = 0;  // --device cuda: peak GPU memory allocated in this sitting's training
};

// Collective over comm. Throws std::runtime_error / std::invalid_argument with a message
// naming the problem (bad dataset, incompatible checkpoint, ...).
TrainSummary run_training(const TrainOptions& options, dist::Comm& comm);

// A checkpoint's model, built from the checkpoint's own model options with its parameters, and
// the dataset it is scored on (this rank's shards).
struct InferenceModel {
  std::unique_ptr<models::SequenceModel> model;
  io::DatasetMeta meta;
  io::UserSequences seqs;
  std::string checkpoint;  // the checkpoint directory loaded (the newest complete one of a checkpoints/)
  std::string data;        // the dataset directory: `data`, or the one the checkpoint was trained on
  int64_t epoch = -1;      // the epoch the model was trained to; -1 when the checkpoint does not say
};

// Collective over comm. `checkpoint_dir` is a checkpoint or a directory of them (its newest
// complete one); `data` empty takes the dataset the checkpoint records (saying so on a line
// tagged `tag`). Throws naming the problem: no checkpoint, a dataset of another item count, ...
InferenceModel load_for_inference(const std::string& checkpoint_dir, const std::string& data, dist::Comm& comm,
                                  const std::string& device, const std::string& tag);

// Loads the parameters of a checkpoint directory (a `checkpoints/step-*` or `best`) into a
// model built from the checkpoint's own model options, and evaluates it.
void run_evaluation(const std::string& checkpoint_dir, const std::string& data, Split split,
                    const EvalProtocol& protocol, const EvalOptions& eval, dist::Comm& comm,
                    const std::string& device = "cpu");

}  // namespace seqrec::train
