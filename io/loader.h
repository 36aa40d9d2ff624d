#pragma once
// Training batches for next-item prediction under the leave-one-out split.
//
// Every random choice about an example is drawn from a generator keyed by
// (seed, epoch, global example index), and the global batch is defined over global user
// ids, so the stream of examples and their negatives is the same at any world size: the
// global batch k of an epoch is perm[k*G, (k+1)*G) with G = per-rank batch * world, and
// each rank takes the members of that batch whose user lives in the shards it owns.
#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/dataset.h"

namespace seqrec::io {

// SplitMix64-based counter RNG: cheap to construct per example, statistically fine for
// sampling, identical on every platform.
class KeyedRng {
 public:
  KeyedRng(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0);
  uint64_t next();
  uint64_t below(uint64_t n);  // uniform in [0, n), n > 0
  double uniform();            // [0, 1)

 private:
  uint64_t state_;
};

// Leave-one-out: the last item is the test target, the second last the validation target,
// the rest is training. Users with fewer than 3 items are training only.
inline constexpr const char* kSplitRule =
    "leave-one-out: last item -> test, second last -> valid, the rest -> train; users with < 3 "
    "items are train only";
inline int64_t train_length(int64_t n) { return n >= 3 ? n - 2 : n; }

struct LoaderOptions {
  int64_t max_len = 200;
  // false: one example per user per epoch, its most recent max_len training transitions (older
  // ones are never trained on). true: every training transition, each user's history cut from
  // the end into windows of max_len transitions, one example per window (the released LISA
  // code trains this way); the oldest window may be shorter.
  bool windows = false;
  // true: every prefix of each user's training history is its own example, its most recent
  // max_len transitions right-aligned (RecBole's scheme; with the last-slot objective, how the
  // released LinRec code trains). Not with windows.
  bool prefixes = false;
  // true: each example's target (and negative) at its last slot only, the others inputs alone
  // (the last-slot objective); false: the next item at every slot.
  bool last_target_only = false;
  int64_t batch_size = 128;  // per rank; the global batch is batch_size * world
  uint64_t seed = 42;
  int prefetch = 4;          // batches built ahead by the prefetch thread; 0 = synchronous
};

// Position in the example stream: the next batch to be returned is `step` of `epoch`.
struct Cursor {
  int64_t epoch = 0;
  int64_t step = 0;
};

struct TrainBatch {
  at::Tensor users;   // [n] int64 global user ids (n = this rank's share, may be 0)
  at::Tensor input;   // [n, L] int64, left-padded
  at::Tensor pos;     // [n, L] next item at every slot (0 where there is none; with
                      // last_target_only at the last slot alone)
  at::Tensor neg;     // [n, L] one negative per target slot, never in the user's train items
  Cursor cursor;      // the position this batch was taken from
  int64_t global_batch_users = 0;  // users in the global batch (all ranks)
};

// Examples a user contributes per epoch: 1, with windows ceil(transitions / max_len), with
// prefixes transitions (each at least 1), where transitions = train_length - 1.
int64_t examples_of(int64_t length, const LoaderOptions& options);

class TrainLoader {
 public:
  // `examples_per_user` (size meta.num_users, all ranks' users) is required with
  // options.windows or options.prefixes, since a rank holds the lengths of its own users only
  // (the trainer all-reduces them); otherwise it is ignored. Throws std::invalid_argument on a
  // missing or wrongly sized vector, or on windows and prefixes together.
  TrainLoader(const UserSequences& sequences, const DatasetMeta& meta, LoaderOptions options, int rank,
              int world, std::vector<int64_t> examples_per_user = {});
  ~TrainLoader();
  TrainLoader(const TrainLoader&) = delete;
  TrainLoader& operator=(const TrainLoader&) = delete;

  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  // Positions the stream so that next() returns the batch at `cursor`.
  void seek(Cursor cursor);
  // The next batch; advances the cursor across epoch boundaries.
  TrainBatch next();
  // Position of the batch next() will return.
  Cursor cursor() const { return next_; }

  // Builds one batch directly (no prefetch); used by next() and by tests.
  TrainBatch build(Cursor at) const;

 private:
  void start_prefetch();
  void stop_prefetch();
  void prefetch_loop(Cursor from);
  Cursor advance(Cursor c) const;
  const std::vector<int64_t>& permutation(int64_t epoch) const;

  const UserSequences& seqs_;
  int64_t num_users_;
  int64_t num_items_;
  int64_t num_examples_;
  std::vector<int64_t> first_example_;  // with windows or prefixes: prefix sums of examples per user (size U + 1)
  LoaderOptions opt_;
  int rank_, world_;
  int64_t global_batch_;
  int64_t steps_per_epoch_;
  Cursor next_;

  mutable std::mutex perm_mu_;
  mutable int64_t perm_epoch_ = -1;
  mutable std::vector<int64_t> perm_;

  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TrainBatch> queue_;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace seqrec::io
