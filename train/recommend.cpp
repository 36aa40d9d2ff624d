#include "train/recommend.h"

#include <fcntl.h>
#include <unistd.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <unordered_map>

#include "dist/comm.h"
#include "io/dataset.h"
#include "train/evaluator.h"
#include "train/trainer.h"

namespace seqrec::train {
namespace {

// Writes to `<path>.tmp-<pid>` and renames it to `path` only when every byte is on disk; on any
// failure the temporary file is removed and whatever stood at `path` stays as it was.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp-" + std::to_string(getpid())) {
    f_ = std::fopen(tmp_.c_str(), "w");
    if (!f_) throw std::runtime_error("cannot write " + path_ + ": " + std::strerror(errno));
  }
  ~AtomicFile() {
    if (f_) {
      std::fclose(f_);
      std::remove(tmp_.c_str());
    }
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  std::FILE* get() { return f_; }
  void commit() {
    const bool ok = std::fflush(f_) == 0 && fsync(fileno(f_)) == 0 && !std::ferror(f_);
    const int err = errno;
    std::fclose(f_);
    f_ = nullptr;
    if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int e = ok ? errno : err;
      std::remove(tmp_.c_str());
      throw std::runtime_error("cannot write " + path_ + ": " + std::strerror(e));
    }
  }

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
};

// raw id -> dense index (users: index u; items: index i - 1 holds item i). Without raw ids
// (synthetic data) the dense ids stand for themselves.
std::unordered_map<std::string, int64_t> index_of(const std::vector<std::string>& raw) {
  std::unordered_map<std::string, int64_t> m;
  m.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) m.emplace(raw[i], static_cast<int64_t>(i));
  return m;
}

int64_t dense_id(const std::string& text, const std::unordered_map<std::string, int64_t>& raw, int64_t base,
                 int64_t count, const char* what) {
  if (!raw.empty()) {
    auto it = raw.find(text);
    if (it == raw.end())
      throw std::invalid_argument(std::string("unknown ") + what + " id '" + text + "': not in the dataset");
    return it->second + base;
  }
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(text, &used);
  } catch (const std::logic_error&) {
    used = 0;
  }
  if (used != text.size() || v < base || v >= base + count)
    throw std::invalid_argument(std::string("unknown ") + what + " id '" + text + "': this dataset's " + what +
                                "s are " + std::to_string(base) + ".." + std::to_string(base + count - 1));
  return v;
}

}  // namespace

std::vector<Ranked> recommend_batch(models::SequenceModel& model, const std::vector<std::vector<int64_t>>& histories,
                                    const models::UserInput& users, int64_t k, bool exclude_history) {
  if (k < 1) throw std::invalid_argument("k must be >= 1, got " + std::to_string(k));
  const auto& mo = model.options();
  const int64_t N = mo.num_items, nb = static_cast<int64_t>(histories.size());
  if (nb == 0) return {};
  const bool cloze = mo.objective == "cloze";
  const int64_t extra = cloze ? 1 : 0;
  int64_t longest = 0;
  for (const auto& h : histories) {
    if (h.empty()) throw std::invalid_argument("a history to recommend after holds no item");
    for (int64_t item : h)
      if (item < 1 || item > N)
        throw std::invalid_argument("item " + std::to_string(item) + " is outside the model's items 1.." +
                                    std::to_string(N));
    longest = std::max<int64_t>(longest, static_cast<int64_t>(h.size()));
  }
  c10::InferenceMode inference;
  model.set_training(false);
  // Left-padded as in evaluation: positions count from the right, so the batch is as wide as
  // its longest history.
  const int64_t L = std::min(mo.max_len, longest + extra);
  auto input = torch::zeros({nb, L}, torch::kInt64);
  auto* in = input.data_ptr<int64_t>();
  for (int64_t r = 0; r < nb; ++r) {
    const auto& h = histories[r];
    const int64_t count = std::min<int64_t>(static_cast<int64_t>(h.size()), L - extra);
    std::copy(h.end() - count, h.end(), in + r * L + (L - extra - count));
    if (cloze) in[r * L + L - 1] = models::mask_item(mo);
  }
  at::Tensor table = model.item_embeddings();
  const at::Device device = table.device();
  auto hidden = model.encode_last(input.to(device), on_device(users, device)).contiguous();  // [nb, D]
  auto scores = torch::matmul(hidden, table.t()).to(torch::kFloat32);                      // [nb, N+1]
  const float neg_inf = -std::numeric_limits<float>::infinity();
  scores.select(1, 0).fill_(neg_inf);  // padding is never a candidate
  if (exclude_history)
    for (int64_t r = 0; r < nb; ++r)
      scores[r].index_fill_(0, torch::tensor(histories[r], torch::kInt64).to(device), neg_inf);
  const int64_t take = std::min<int64_t>(k, N);
  auto top = scores.topk(take, /*dim=*/1, /*largest=*/true, /*sorted=*/true);
  auto values = std::get<0>(top).to(torch::kCPU).contiguous();
  auto indices = std::get<1>(top).to(torch::kCPU).contiguous();
  const float* v = values.data_ptr<float>();
  const int64_t* ix = indices.data_ptr<int64_t>();
  std::vector<Ranked> out(nb);
  for (int64_t r = 0; r < nb; ++r) {
    std::vector<int64_t> order(take);
    std::iota(order.begin(), order.end(), 0);
    // topk leaves the order of equal scores open: equal scores go by ascending item id.
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const float sa = v[r * take + a], sb = v[r * take + b];
      return sa != sb ? sa > sb : ix[r * take + a] < ix[r * take + b];
    });
    for (int64_t j : order) {
      const float s = v[r * take + j];
      if (s == neg_inf) break;  // excluded or padding: fewer than k candidates left
      out[r].items.push_back(ix[r * take + j]);
      out[r].scores.push_back(s);
    }
  }
  return out;
}

void run_recommend(const RecommendOptions& o, dist::Comm& comm) {
  if (comm.size() != 1)
    throw std::invalid_argument("recommend runs as one process (" + std::to_string(comm.size()) +
                                " ranks here): start it without mpirun/srun");
  if (o.k < 1) throw std::invalid_argument("--top_k must be >= 1, got " + std::to_string(o.k));
  if (o.batch_users < 1) throw std::invalid_argument("--eval_batch must be >= 1");
  if (!o.users.empty() && !o.history.empty())
    throw std::invalid_argument("--user_ids and --history exclude each other: a dataset user is recommended "
                                "after their own sequence, --history stands for a user the dataset does not hold");
  // Fail before loading anything when the output cannot be written.
  std::unique_ptr<AtomicFile> file;
  if (!o.out.empty()) file = std::make_unique<AtomicFile>(o.out);

  InferenceModel m = load_for_inference(o.checkpoint, o.data, comm, o.device, "recommend");
  const auto& mo = m.model->options();
  const int64_t N = m.meta.num_items;
  if (o.k > N)
    throw std::invalid_argument("--top_k " + std::to_string(o.k) + " exceeds the dataset's " + std::to_string(N) +
                                " items");
  // The users' raw ids only where they are named or listed (a given history needs none).
  const auto raw_users = o.history.empty() ? io::read_raw_ids(m.data, "user") : std::vector<std::string>{};
  const auto raw_items = io::read_raw_ids(m.data, "item");
  const auto user_text = [&](int64_t u) { return raw_users.empty() ? std::to_string(u) : raw_users[u]; };
  const auto item_text = [&](int64_t i) { return raw_items.empty() ? std::to_string(i) : raw_items[i - 1]; };

  std::vector<int64_t> users;  // dense ids; empty with a given history
  std::vector<int64_t> given;  // the given history, dense
  if (!o.history.empty()) {
    if (mo.model == "flash4rec" && mo.flash_user == "embedding")
      throw std::invalid_argument("--history: this flash4rec model learned one vector per dataset user "
                                  "(--flash_user embedding) and has none for a user outside the dataset; "
                                  "name a dataset user with --user_ids instead");
    const auto index = index_of(raw_items);
    for (const auto& t : o.history) given.push_back(dense_id(t, index, 1, N, "item"));
  } else if (!o.users.empty()) {
    const auto index = index_of(raw_users);
    for (const auto& t : o.users) users.push_back(dense_id(t, index, 0, m.meta.num_users, "user"));
  } else {
    for (int64_t u = 0; u < m.meta.num_users; ++u) users.push_back(u);
  }

  std::FILE* f = file ? file->get() : stdout;
  const std::string history_text =
      given.empty() ? "each user's whole sequence (training, valid and test items), its last " +
                          std::to_string(mo.max_len) + " read"
                    : "the " + std::to_string(given.size()) + " items given, its last " + std::to_string(mo.max_len) +
                          " read, as a user outside the dataset";
  std::fprintf(f,
               "# seqrec recommend: checkpoint %s (epoch %lld, model %s), dataset '%s' (%s); history: %s; "
               "candidates: all %lld items%s; k %lld; score: the model's logit; ties by item id\n",
               m.checkpoint.c_str(), static_cast<long long>(m.epoch), mo.model.c_str(), m.meta.name.c_str(),
               m.data.c_str(), history_text.c_str(), static_cast<long long>(N),
               o.exclude_history ? " less the history's" : ", the history's own included", static_cast<long long>(o.k));
  std::fprintf(f, "user\trank\titem\tscore\n");
  const auto write = [&](const std::string& user, const Ranked& r) {
    for (size_t j = 0; j < r.items.size(); ++j)
      std::fprintf(f, "%s\t%zu\t%s\t%.6g\n", user.c_str(), j + 1, item_text(r.items[j]).c_str(), r.scores[j]);
  };

  if (!given.empty()) {
    models::UserInput anonymous;
    const int64_t features = static_cast<int64_t>(m.meta.user_feature_cardinalities.size());
    if (features > 0) anonymous.features = torch::zeros({1, features}, torch::kInt64);  // 0 = unknown
    write("-", recommend_batch(*m.model, {given}, anonymous, o.k, o.exclude_history).front());
  } else {
    // Users of similar length share a batch (a batch is as wide as its longest history); the
    // rows come out in the order asked.
    std::vector<size_t> order(users.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return m.seqs.length(users[a]) > m.seqs.length(users[b]); });
    std::vector<Ranked> ranked(users.size());
    for (size_t b0 = 0; b0 < order.size(); b0 += static_cast<size_t>(o.batch_users)) {
      if (o.stop_requested && o.stop_requested())
        throw std::runtime_error("stopped by a signal after " + std::to_string(b0) + " of " +
                                 std::to_string(users.size()) + " users; nothing written");
      const size_t nb = std::min(order.size() - b0, static_cast<size_t>(o.batch_users));
      std::vector<std::vector<int64_t>> histories;
      std::vector<int64_t> ids;
      for (size_t r = 0; r < nb; ++r) {
        const int64_t u = users[order[b0 + r]];
        const int32_t* s = m.seqs.items_of(u);
        histories.emplace_back(s, s + m.seqs.length(u));
        ids.push_back(u);
      }
      auto batch = recommend_batch(*m.model, histories, user_input(torch::tensor(ids, torch::kInt64), m.seqs, m.meta),
                                   o.k, o.exclude_history);
      for (size_t r = 0; r < nb; ++r) ranked[order[b0 + r]] = std::move(batch[r]);
    }
    for (size_t i = 0; i < users.size(); ++i) write(user_text(users[i]), ranked[i]);
  }
  if (file) {
    file->commit();
    std::fprintf(stderr, "[recommend] %zu user(s) x top %lld written to %s\n", given.empty() ? users.size() : size_t{1},
                 static_cast<long long>(o.k), o.out.c_str());
  } else {
    std::fflush(stdout);
  }
}

}  // namespace seqrec::train
