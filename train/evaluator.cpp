#include "train/evaluator.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "dist/comm.h"
#include "io/loader.h"
#include "models/model.h"

namespace seqrec::train {
namespace {
constexpr uint64_t kEvalTag = 0x4556414Cull;
}

const char* split_name(Split s) { return s == Split::kValid ? "valid" : "test"; }

std::string EvalProtocol::describe() const {
  std::ostringstream s;
  if (sampled) {
    s << "sampled: 1 target + " << negatives << (popularity ? " popularity-proportional" : " uniform")
      << " negatives not in the user's sequence";
  } else {
    s << "full ranking over all items"
      << (exclude_history ? ", the user's history excluded" : ", history not excluded");
  }
  return s.str();
}

std::string EvalProtocol::key() const {
  if (sampled) return "sampled" + std::to_string(negatives) + (popularity ? "-popularity" : "-uniform");
  return exclude_history ? "full-exclude-history" : "full";
}

double EvalResult::get(const std::string& name) const {
  auto it = metrics.find(name);
  if (it == metrics.end()) throw std::invalid_argument("no metric '" + name + "' in evaluation result");
  return it->second;
}

models::UserInput user_input(const at::Tensor& ids, const io::UserSequences& seqs, const io::DatasetMeta& meta) {
  models::UserInput u;
  u.ids = ids;
  const int64_t features = static_cast<int64_t>(meta.user_feature_cardinalities.size());
  if (features > 0) {
    auto table = torch::from_blob(const_cast<int32_t*>(seqs.user_features.data()), {seqs.num_users(), features},
                                  torch::kInt32);
    u.features = table.index_select(0, ids - seqs.user_begin).to(torch::kLong);
  }
  return u;
}

models::UserInput on_device(models::UserInput users, const at::Device& device) {
  if (users.ids.defined()) users.ids = users.ids.to(device);
  if (users.features.defined()) users.features = users.features.to(device);
  return users;
}

int64_t pessimistic_rank(const float* scores, int64_t n) {
  const float t = scores[0];
  int64_t rank = 1;
  for (int64_t j = 1; j < n; ++j) rank += (scores[j] >= t || std::isnan(scores[j])) ? 1 : 0;
  return std::isnan(t) ? n : rank;
}

void accumulate_rank(int64_t rank, const std::vector<int>& ks, std::map<std::string, double>& sums) {
  for (int k : ks) {
    const bool hit = rank <= k;
    sums["HR@" + std::to_string(k)] += hit ? 1.0 : 0.0;
    sums["NDCG@" + std::to_string(k)] += hit ? 1.0 / std::log2(rank + 1.0) : 0.0;
    sums["MRR@" + std::to_string(k)] += hit ? 1.0 / rank : 0.0;
  }
  sums["MRR"] += 1.0 / rank;
}

std::vector<double> item_popularity(const io::UserSequences& seqs, const io::DatasetMeta& meta,
                                    dist::Comm& comm) {
  auto counts = torch::zeros({meta.num_items + 1}, torch::kFloat64);
  auto* c = counts.data_ptr<double>();
  for (int64_t u = seqs.user_begin; u < seqs.user_end; ++u) {
    const int32_t* s = seqs.items_of(u);
    const int64_t m = io::train_length(seqs.length(u));
    for (int64_t i = 0; i < m; ++i) c[s[i]] += 1;
  }
  comm.all_reduce(counts);
  return std::vector<double>(c, c + meta.num_items + 1);
}

void check_protocol(const EvalProtocol& protocol, const io::DatasetMeta& meta) {
  if (protocol.sampled && protocol.negatives >= meta.num_items)
    throw std::invalid_argument("sampled evaluation needs fewer negatives (" +
                                std::to_string(protocol.negatives) + ") than items (" +
                                std::to_string(meta.num_items) + ")");
}

EvalResult evaluate(models::SequenceModel& model, const io::UserSequences& seqs,
                    const io::DatasetMeta& meta, Split split, const EvalProtocol& protocol,
                    const EvalOptions& options, dist::Comm& comm, const std::vector<double>* popularity) {
  const auto t0 = std::chrono::steady_clock::now();
  check_protocol(protocol, meta);
  if (protocol.sampled && protocol.popularity && !popularity)
    throw std::invalid_argument("popularity-sampled evaluation needs item popularity counts");
  // Inference mode: no autograd records and no version-counter bookkeeping for the pass.
  c10::InferenceMode inference;
  model.set_training(false);
  const int64_t N = meta.num_items, C = protocol.negatives + 1;
  // Cumulative popularity for inverse-CDF sampling.
  std::vector<double> cdf;
  if (protocol.sampled && protocol.popularity) {
    cdf.resize(N + 1, 0.0);
    for (int64_t i = 1; i <= N; ++i) cdf[i] = cdf[i - 1] + (*popularity)[i];
  }

  std::vector<int64_t> users;
  for (int64_t u = seqs.user_begin; u < seqs.user_end; ++u)
    if (seqs.length(u) >= 3) users.push_back(u);
  // Users of similar length share a batch, and a batch is only as wide as its longest
  // history: left padding is exact to drop (positions are counted from the right).
  std::stable_sort(users.begin(), users.end(),
                   [&](int64_t a, int64_t b) { return seqs.length(a) > seqs.length(b); });
  const int64_t history_offset = split == Split::kValid ? 2 : 1;

  std::map<std::string, double> sums;
  for (int k : options.ks) {
    sums["HR@" + std::to_string(k)] = 0;
    sums["NDCG@" + std::to_string(k)] = 0;
    sums["MRR@" + std::to_string(k)] = 0;
  }
  sums["MRR"] = 0;
  sums["tied"] = 0;  // every key exists on every rank: the packed all-reduce below has one size

  at::Tensor table = model.item_embeddings();
  // Batches are assembled on the host and scored where the model lives.
  const at::Device device = table.device();
  // Cloze-trained models read the history followed by a [mask] slot whose output scores the
  // next item (BERT4Rec's protocol).
  const bool cloze = model.options().objective == "cloze";
  const int64_t extra = cloze ? 1 : 0;
  std::vector<uint8_t> seen(N + 1, 0);
  int64_t batches = (static_cast<int64_t>(users.size()) + options.batch_users - 1) / options.batch_users;
  if (options.lockstep) {
    auto most = torch::tensor({batches}, torch::kInt64);
    comm.all_reduce(most, dist::ReduceOp::kMax);
    batches = most.item<int64_t>();
  }
  for (int64_t batch = 0; batch < batches; ++batch) {
    const size_t b0 = static_cast<size_t>(batch * options.batch_users);
    const int64_t nb = std::min<int64_t>(options.batch_users, std::max<int64_t>(0, users.size() - b0));
    // An empty batch (lockstep only) still runs the model's forward once, on no rows.
    const int64_t L = nb == 0 ? 1 : std::min(options.max_len, seqs.length(users[b0]) - history_offset + extra);
    auto input = torch::zeros({nb, L}, torch::kInt64);
    auto targets = torch::zeros({nb}, torch::kInt64);
    auto cands = protocol.sampled ? torch::zeros({nb, C}, torch::kInt64) : at::Tensor();
    auto* in = input.data_ptr<int64_t>();
    auto* tg = targets.data_ptr<int64_t>();
    for (int64_t r = 0; r < nb; ++r) {
      const int64_t u = users[b0 + r];
      const int32_t* s = seqs.items_of(u);
      const int64_t n = seqs.length(u);
      const int64_t hist = n - history_offset;  // items before the target
      tg[r] = s[hist];
      const int64_t count = std::min(hist, L - extra);
      for (int64_t j = 0; j < count; ++j) in[r * L + (L - extra - count + j)] = s[hist - count + j];
      if (cloze) in[r * L + L - 1] = models::mask_item(model.options());
      if (protocol.sampled) {
        auto* cd = cands.data_ptr<int64_t>() + r * C;
        cd[0] = s[hist];
        for (int64_t i = 0; i < n; ++i) seen[s[i]] = 1;
        io::KeyedRng rng(options.seed, kEvalTag ^ (split == Split::kValid ? 1u : 2u), u);
        int64_t filled = 1, tries = 0;
        while (filled < C) {
          int64_t item;
          if (protocol.popularity) {
            const double x = rng.uniform() * cdf[N];
            item = std::upper_bound(cdf.begin() + 1, cdf.end(), x) - cdf.begin();
            item = std::min<int64_t>(std::max<int64_t>(item, 1), N);
          } else {
            item = 1 + static_cast<int64_t>(rng.below(N));
          }
          if (++tries > 1000 * C)
            throw std::runtime_error("cannot draw " + std::to_string(protocol.negatives) +
                                     " distinct negatives outside user " + std::to_string(u) +
                                     "'s sequence; use fewer negatives");
          if (seen[item]) continue;
          seen[item] = 1;  // distinct negatives
          cd[filled++] = item;
        }
        for (int64_t i = 1; i < C; ++i) seen[cd[i]] = 0;
        for (int64_t i = 0; i < n; ++i) seen[s[i]] = 0;
      }
    }
    auto ids = nb == 0 ? torch::zeros({0}, torch::kInt64)
                       : torch::from_blob(const_cast<int64_t*>(users.data() + b0), {nb}, torch::kInt64).clone();
    if (!device.is_cpu()) {
      input = input.to(device);
      targets = targets.to(device);
      if (cands.defined()) cands = cands.to(device);
    }
    auto h = model.encode_last(input, on_device(user_input(ids, seqs, meta), device)).contiguous();  // [nb, D]
    at::Tensor scores;
    if (protocol.sampled) {
      scores = torch::bmm(table.index_select(0, cands.view({-1})).view({nb, C, table.size(1)}), h.unsqueeze(2))
                   .squeeze(2);
    } else {
      auto full = torch::matmul(h, table.t());  // [nb, N+1]
      auto target_scores = full.gather(1, targets.unsqueeze(1));
      const float neg_inf = -std::numeric_limits<float>::infinity();
      full.select(1, 0).fill_(neg_inf);  // padding is never a candidate
      if (protocol.exclude_history) {
        for (int64_t r = 0; r < nb; ++r) {
          const int64_t u = users[b0 + r];
          const int64_t hist = seqs.length(u) - history_offset;
          auto idx = torch::from_blob(const_cast<int32_t*>(seqs.items_of(u)), {hist}, torch::kInt32)
                         .to(torch::kInt64)
                         .to(device);
          full[r].index_fill_(0, idx, neg_inf);
        }
      }
      // The target competes against every other item: take its column out, put its score first.
      full.scatter_(1, targets.unsqueeze(1), neg_inf);
      scores = torch::cat({target_scores, full}, 1);
    }
    scores = scores.to(torch::kCPU).to(torch::kFloat32).contiguous();
    const auto* sc = scores.data_ptr<float>();
    const int64_t width = scores.size(1);
    for (int64_t r = 0; r < nb; ++r) {
      const float* row = sc + r * width;
      accumulate_rank(pessimistic_rank(row, width), options.ks, sums);
      // How often the pessimistic tie rule matters: the target's score equals another
      // candidate's (models that score quantized targets, such as LISA-Base, can tie).
      sums["tied"] += std::find(row + 1, row + width, row[0]) != row + width ? 1.0 : 0.0;
    }
  }

  // One all-reduce for every sum plus the user count.
  std::vector<std::string> names;
  auto packed = torch::zeros({static_cast<int64_t>(sums.size()) + 1}, torch::kFloat64);
  auto* p = packed.data_ptr<double>();
  int64_t i = 0;
  for (auto& [k, v] : sums) {
    names.push_back(k);
    p[i++] = v;
  }
  p[i] = static_cast<double>(users.size());
  comm.all_reduce(packed);
  EvalResult res;
  res.split = split;
  res.protocol = protocol;
  res.users = static_cast<int64_t>(std::llround(p[i]));
  for (size_t j = 0; j < names.size(); ++j) res.metrics[names[j]] = res.users ? p[j] / res.users : 0.0;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

std::string format_result(const EvalResult& r, const std::string& dataset, int64_t epoch) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(4) << "[eval] dataset=" << dataset << " split=" << split_name(r.split)
    << " epoch=" << epoch << " protocol=\"" << r.protocol.describe() << "\" tie=pessimistic users=" << r.users;
  for (const char* m : {"HR@5", "HR@10", "HR@20", "NDCG@5", "NDCG@10", "NDCG@20", "MRR@10", "MRR", "tied"}) {
    auto it = r.metrics.find(m);
    if (it != r.metrics.end()) s << " " << m << "=" << it->second;
  }
  s << std::setprecision(1) << " (" << r.seconds << " s)";
  return s.str();
}

namespace {
std::string json_escape(const std::string& in) {
  std::string out;
  for (char c : in) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out;
}
}  // namespace

std::string result_json(const EvalResult& r, const std::string& dataset, int64_t epoch, int64_t step) {
  std::ostringstream s;
  s << std::setprecision(6) << "{\"dataset\":\"" << json_escape(dataset) << "\",\"split\":\""
    << split_name(r.split) << "\",\"epoch\":" << epoch << ",\"step\":" << step << ",\"protocol\":\""
    << r.protocol.key() << "\",\"candidates\":\"" << json_escape(r.protocol.describe())
    << "\",\"tie\":\"pessimistic\",\"users\":" << r.users;
  for (auto& [k, v] : r.metrics) s << ",\"" << k << "\":" << v;
  s << ",\"seconds\":" << r.seconds << "}";
  return s.str();
}

}  // namespace seqrec::train
