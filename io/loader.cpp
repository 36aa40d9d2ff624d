#include "io/loader.h"

#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace seqrec::io {
namespace {

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Tags separate the streams drawn from one (seed, epoch) key.
constexpr uint64_t kShuffleTag = 0x5348554646ull;
constexpr uint64_t kNegativeTag = 0x4E4547ull;

}  // namespace

KeyedRng::KeyedRng(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) : state_(seed) {
  uint64_t s = seed;
  state_ = splitmix(s) ^ a;
  state_ = splitmix(state_) ^ b;
  state_ = splitmix(state_) ^ c;
  splitmix(state_);
}

uint64_t KeyedRng::next() { return splitmix(state_); }

uint64_t KeyedRng::below(uint64_t n) {
  // Lemire's multiply-shift; the tiny bias at n << 2^64 is irrelevant for sampling.
  return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
}

double KeyedRng::uniform() { return (next() >> 11) * 0x1.0p-53; }

int64_t examples_of(int64_t length, const LoaderOptions& options) {
  if (!options.windows && !options.prefixes) return 1;
  const int64_t transitions = train_length(length) - 1;
  if (options.prefixes) return std::max<int64_t>(1, transitions);
  return std::max<int64_t>(1, (transitions + options.max_len - 1) / options.max_len);
}

TrainLoader::TrainLoader(const UserSequences& sequences, const DatasetMeta& meta, LoaderOptions options,
                         int rank, int world, std::vector<int64_t> examples_per_user)
    : seqs_(sequences),
      num_users_(meta.num_users),
      num_items_(meta.num_items),
      opt_(options),
      rank_(rank),
      world_(world) {
  if (opt_.max_len <= 0) throw std::invalid_argument("max_len must be > 0");
  if (opt_.batch_size <= 0) throw std::invalid_argument("batch_size must be > 0");
  if (num_users_ <= 0) throw std::invalid_argument("dataset has no users");
  if (opt_.windows && opt_.prefixes)
    throw std::invalid_argument("training windows and training prefixes exclude each other");
  num_examples_ = num_users_;
  if (opt_.windows || opt_.prefixes) {
    const std::string what = opt_.windows ? "training windows" : "training prefixes";
    if (static_cast<int64_t>(examples_per_user.size()) != num_users_)
      throw std::invalid_argument(what + " need the example count of every user: got " +
                                  std::to_string(examples_per_user.size()) + " counts for " +
                                  std::to_string(num_users_) + " users");
    first_example_.assign(num_users_ + 1, 0);
    for (int64_t u = 0; u < num_users_; ++u) {
      if (examples_per_user[u] < 1)
        throw std::invalid_argument("user " + std::to_string(u) + " has " + std::to_string(examples_per_user[u]) +
                                    " " + what + " (at least 1 expected)");
      first_example_[u + 1] = first_example_[u] + examples_per_user[u];
    }
    num_examples_ = first_example_.back();
  }
  global_batch_ = opt_.batch_size * world_;
  steps_per_epoch_ = (num_examples_ + global_batch_ - 1) / global_batch_;
  start_prefetch();
}

TrainLoader::~TrainLoader() { stop_prefetch(); }

const std::vector<int64_t>& TrainLoader::permutation(int64_t epoch) const {
  // Called from one thread at a time (the prefetch thread, or the caller when synchronous).
  std::lock_guard<std::mutex> lock(perm_mu_);
  if (perm_epoch_ != epoch) {
    perm_.resize(num_examples_);
    std::iota(perm_.begin(), perm_.end(), 0);
    KeyedRng rng(opt_.seed, kShuffleTag, static_cast<uint64_t>(epoch));
    for (int64_t i = num_examples_ - 1; i > 0; --i) std::swap(perm_[i], perm_[rng.below(i + 1)]);
    perm_epoch_ = epoch;
  }
  return perm_;
}

Cursor TrainLoader::advance(Cursor c) const {
  if (++c.step >= steps_per_epoch_) {
    c.step = 0;
    ++c.epoch;
  }
  return c;
}

TrainBatch TrainLoader::build(Cursor at) const {
  const auto& perm = permutation(at.epoch);
  const int64_t begin = at.step * global_batch_;
  const int64_t end = std::min(begin + global_batch_, num_examples_);
  // Example e is (user, window): window 0 holds a user's most recent transitions (with
  // prefixes, window w is the prefix that stops w transitions before them).
  std::vector<int64_t> mine, window;
  for (int64_t i = begin; i < end; ++i) {
    int64_t u = perm[i], w = 0;
    if (!first_example_.empty()) {
      u = std::upper_bound(first_example_.begin(), first_example_.end(), perm[i]) - first_example_.begin() - 1;
      w = perm[i] - first_example_[u];
    }
    if (seqs_.owns(u)) {
      mine.push_back(u);
      window.push_back(w);
    }
  }

  const int64_t n = static_cast<int64_t>(mine.size()), L = opt_.max_len;
  TrainBatch b;
  b.cursor = at;
  b.global_batch_users = end - begin;
  b.users = torch::from_blob(mine.data(), {n}, torch::kInt64).clone();
  b.input = torch::zeros({n, L}, torch::kInt64);
  b.pos = torch::zeros({n, L}, torch::kInt64);
  b.neg = torch::zeros({n, L}, torch::kInt64);
  auto* in = b.input.data_ptr<int64_t>();
  auto* pos = b.pos.data_ptr<int64_t>();
  auto* neg = b.neg.data_ptr<int64_t>();

  std::vector<uint8_t> seen(num_items_ + 1, 0);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t u = mine[r];
    const int32_t* s = seqs_.items_of(u);
    const int64_t m = train_length(seqs_.length(u));
    if (m < 2) continue;  // nothing to predict
    // Transitions s[t] -> s[t+1], t < m - 1; window w holds the L of them that end w·L
    // transitions before the most recent one (prefix w: w transitions before), right-aligned.
    const int64_t stop = m - 1 - window[r] * (opt_.prefixes ? 1 : L);
    if (stop <= 0) continue;  // a count from another configuration: nothing in this window
    for (int64_t i = 0; i < m; ++i) seen[s[i]] = 1;
    const int64_t count = std::min<int64_t>(stop, L);
    const int64_t first = stop - count;
    KeyedRng rng(opt_.seed, kNegativeTag ^ static_cast<uint64_t>(at.epoch), static_cast<uint64_t>(u),
                 static_cast<uint64_t>(window[r]));
    for (int64_t j = 0; j < count; ++j) {
      const int64_t slot = r * L + (L - count + j);
      in[slot] = s[first + j];
      if (opt_.last_target_only && j + 1 < count) continue;
      pos[slot] = s[first + j + 1];
      int64_t cand;
      int tries = 0;
      do {
        cand = 1 + static_cast<int64_t>(rng.below(num_items_));
        // A user who has seen (nearly) every item: after many rejections accept any item
        // rather than loop forever; only possible on toy catalogues.
      } while (seen[cand] && ++tries < 1000);
      neg[slot] = cand;
    }
    for (int64_t i = 0; i < m; ++i) seen[s[i]] = 0;
  }
  return b;
}

void TrainLoader::seek(Cursor cursor) {
  if (cursor.epoch < 0 || cursor.step < 0 || cursor.step >= steps_per_epoch_)
    throw std::invalid_argument("loader cursor out of range: epoch " + std::to_string(cursor.epoch) +
                                " step " + std::to_string(cursor.step) + " (steps per epoch " +
                                std::to_string(steps_per_epoch_) + ")");
  stop_prefetch();
  next_ = cursor;
  start_prefetch();
}

TrainBatch TrainLoader::next() {
  TrainBatch b;
  if (opt_.prefetch <= 0) {
    b = build(next_);
  } else {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty() || error_; });
    if (queue_.empty() && error_) std::rethrow_exception(error_);
    b = std::move(queue_.front());
    queue_.pop_front();
    cv_.notify_all();
  }
  next_ = advance(next_);
  return b;
}

void TrainLoader::start_prefetch() {
  if (opt_.prefetch <= 0) return;
  stop_ = false;
  error_ = nullptr;
  queue_.clear();
  worker_ = std::thread([this, from = next_] { prefetch_loop(from); });
}

void TrainLoader::stop_prefetch() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
  queue_.clear();
}

void TrainLoader::prefetch_loop(Cursor from) {
  try {
    for (Cursor c = from;; c = advance(c)) {
      TrainBatch b = build(c);
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || static_cast<int>(queue_.size()) < opt_.prefetch; });
      if (stop_) return;
      queue_.push_back(std::move(b));
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

}  // namespace seqrec::io
