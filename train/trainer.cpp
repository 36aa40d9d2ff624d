#include "train/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <sys/resource.h>
#include <unistd.h>

#include "dist/comm.h"
#include "dist/data_parallel.h"
#include "io/build_info.h"
#include "io/dataset.h"
#include "io/log.h"
#include "ops/kernels.h"
#include "ops/length_slices/length_slices.h"
#include "ops/profile_scope.h"
#include "ops/softmax_loss/softmax_loss.h"
#include "train/checkpoint.h"
#include "train/device.h"
#include "train/loss_sampler.h"
#include "train/run_summary.h"
#include "train/host_allocator.h"
#include "train/profiler.h"
#include "train/run_lock.h"

namespace seqrec::train {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// This process's resident memory now, in MiB (0 where /proc is missing): printed with progress
// so that a run whose memory grows shows it long before the OOM killer does.
double resident_mib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  if (!(statm >> pages >> resident)) return 0.0;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}


// Rank 0 writes the run's human log (stdout + <out>/train.log) and metrics.jsonl.
class RunLog {
 public:
  RunLog(const std::string& out, bool active) : active_(active) {
    if (!active_) return;
    log_.open(out + "/train.log", std::ios::app);
    metrics_.open(out + "/metrics.jsonl", std::ios::app);
    if (!log_ || !metrics_) throw std::runtime_error("cannot open train.log / metrics.jsonl in " + out);
  }
  void line(const std::string& s) {
    if (!active_) return;
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
    log_ << s << "\n";
    log_.flush();
  }
  // To the log file only (the launcher prints errors to stderr itself), every line of `text`
  // behind `prefix`.
  void record(const std::string& prefix, const std::string& text) {
    if (!active_) return;
    std::istringstream lines(text);
    for (std::string l; std::getline(lines, l);) log_ << prefix << l << "\n";
    log_.flush();
  }
  void metrics(const std::string& json) {
    if (!active_) return;
    metrics_ << json << "\n";
    metrics_.flush();
  }

 private:
  bool active_;
  std::ofstream log_, metrics_;
};

// Progress of the run that must survive a restart.
struct Progress {
  int64_t step = 0;               // optimizer steps taken
  int64_t evaluated_epochs = 0;   // validation done after this many epochs
  double best_value = -std::numeric_limits<double>::infinity();
  int64_t best_epoch = -1;
  int64_t bad_evals = 0;          // validations since the last improvement
  double train_seconds = 0;       // wall time spent in training steps
};

// The run's schedule: a decay ends at the planned last step, epochs x steps per epoch.
LrSchedule lr_schedule_of(const TrainOptions& o, int64_t steps_per_epoch) {
  LrSchedule s;
  s.lr = o.adam.lr;
  s.warmup_steps = o.warmup_steps;
  s.kind = o.lr_schedule;
  s.final_ratio = o.lr_final_ratio;
  s.decay_end = o.epochs * steps_per_epoch;
  s.decay_start = o.lr_decay_from_epoch * steps_per_epoch;
  s.validate();
  return s;
}

at::Generator& dropout_generator() {
  static at::Generator gen = at::detail::getDefaultCPUGenerator();
  return gen;
}

at::Tensor generator_state() {
  auto& gen = dropout_generator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(const at::Tensor& state) {
  auto& gen = dropout_generator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

void seed_generator(uint64_t seed) {
  auto& gen = dropout_generator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
}

// The encoded target slots of some rows: hidden states [T, D] and their targets [T] (negatives
// under --loss bce). With `last_only` (the last-slot objective: each row's one target is at its
// last slot) only the last slot is encoded, so the last block skips its feed-forward, output
// projection and every attention query but one at the other slots, which no loss reads.
struct Targets {
  at::Tensor h, pos, neg;
};

// The encoded slots h [S, D] whose target slot_pos [S] is an item, with their targets (and
// negatives slot_neg [S] under bce).
Targets targets_of(const at::Tensor& h, const at::Tensor& slot_pos, const at::Tensor& slot_neg,
                   const std::string& kind) {
  // The target slots in row-major order, found once: each boolean-mask index would find them
  // again, and on a GPU every search is a wait for the device.
  auto at_targets = slot_pos.ne(0).nonzero().view({-1});
  Targets t{h.index_select(0, at_targets), slot_pos.index_select(0, at_targets), {}};
  if (kind == "bce") t.neg = slot_neg.index_select(0, at_targets);
  return t;
}

Targets encode_targets(models::SequenceModel& model, const at::Tensor& input, const models::UserInput& users,
                       const at::Tensor& pos, const at::Tensor& neg, const std::string& kind, bool last_only) {
  at::Tensor h, slot_pos, slot_neg;  // [S, D], [S], [S]: the encoded slots and their targets
  if (last_only && input.size(1) > 0) {
    const int64_t last = input.size(1) - 1;
    h = model.encode_last(input, users);  // [n, D]
    slot_pos = pos.select(1, last);
    slot_neg = neg.select(1, last);
  } else {
    h = model.encode(input, users);  // [n, L, D]
    h = h.reshape({-1, h.size(-1)});
    slot_pos = pos.reshape({-1});
    slot_neg = neg.reshape({-1});
  }
  return targets_of(h, slot_pos, slot_neg, kind);
}

// --loss sampled: the step's drawn items [S] and every item's log expected count [N + 1], on
// the model's device.
struct LossSample {
  at::Tensor items, log_expected;
};

// Loss summed over the targets (the caller normalises by the global target count).
at::Tensor targets_loss_sum(const Targets& t, const at::Tensor& table, const std::string& kind,
                            double label_smoothing, int64_t softmax_keep_bytes, const LossSample& sample) {
  SEQREC_PROFILE_SCOPE("seqrec::loss");
  if (kind == "sampled") return ops::sampled_softmax_loss_sum(t.h, table, t.pos, sample.items, sample.log_expected);
  if (kind == "bce") {
    auto pos_logit = (t.h * table.index_select(0, t.pos)).sum(-1);
    auto neg_logit = (t.h * table.index_select(0, t.neg)).sum(-1);
    // -log sigmoid(x) = softplus(-x); -log(1 - sigmoid(x)) = softplus(x)
    return torch::softplus(-pos_logit).sum() + torch::softplus(neg_logit).sum();
  }
  // Softmax over every item, a chunk of rows at a time (the padding item is never a class).
  return ops::softmax_loss_sum(t.h, table, t.pos, 2048, softmax_keep_bytes, label_smoothing);
}

// The batch's loss, computed in up to `groups` slices of rows sorted by length, each slice
// only as wide as its longest row. Rows are independent and left-padded with positions
// counted from the right, so dropping a slice's common padding changes nothing but the
// work: on ML-1M at max_len 200 almost half of all slots are padding. The slices' targets are
// then scored together, in one loss over the batch: the item table takes one gradient from the
// loss per step, not one per slice to be summed. The model encodes the slices in one call
// (SequenceModel::encode_slices: the backbone runs its position-wise layers once over every
// slice's slots, so a slice costs only its attention). Under --loss ce the softmax probabilities are
// kept for the backward only if they fit in softmax_keep_bytes; `targets` is the batch's
// target count.
at::Tensor batch_loss_sum(models::SequenceModel& model, const io::TrainBatch& b, const models::UserInput& users,
                          const std::string& kind, double label_smoothing, int64_t groups, bool whole,
                          bool last_only, double targets, int64_t softmax_keep_bytes, const LossSample& sample) {
  const auto table = model.item_embeddings();
  if (kind == "ce") {
    const double bytes =
        targets * static_cast<double>(table.size(0)) * static_cast<double>(table.element_size());
    if (bytes > static_cast<double>(softmax_keep_bytes)) softmax_keep_bytes = 0;
  }
  if (whole) {
    // One forward over every row in batch order, even none: a mixture of experts' capacity and
    // token priority are defined on the batch as it is, and its collectives need every rank.
    auto t = encode_targets(model, b.input, users, b.pos, b.neg, kind, last_only);
    auto total = targets_loss_sum(t, table, kind, label_smoothing, softmax_keep_bytes, sample);
    auto aux = model.take_auxiliary_loss();
    return aux.defined() ? total + aux : total;
  }
  // Widths from the inputs: under the cloze objective only the masked slots are targets.
  const auto cut = ops::slice_by_length(b.input.ne(0).sum(1), groups);
  if (cut.slices.empty()) return at::Tensor();
  std::vector<at::Tensor> inputs, poss, negs;
  std::vector<models::UserInput> slice_users;
  for (const auto& slice : cut.slices) {
    auto cols = [&](const at::Tensor& t) { return ops::take_slice(t, slice, 1); };
    models::UserInput u;
    if (users.ids.defined()) u.ids = users.ids.index_select(0, slice.rows);
    if (users.features.defined()) u.features = users.features.index_select(0, slice.rows);
    slice_users.push_back(u);
    inputs.push_back(cols(b.input));
    // The encoded slots' targets in encode_slices' order: each row's last slot, or every slot.
    auto flat = [&](const at::Tensor& t) {
      return last_only ? cols(t).select(1, slice.width - 1) : cols(t).reshape({-1});
    };
    poss.push_back(flat(b.pos));
    if (kind == "bce") negs.push_back(flat(b.neg));  // negatives are read under bce alone
  }
  const auto all = targets_of(model.encode_slices(inputs, slice_users, last_only), models::cat_rows(poss),
                              models::cat_rows(negs), kind);
  auto total = targets_loss_sum(all, table, kind, label_smoothing, softmax_keep_bytes, sample);
  // Model-side terms (LISA's inputs-optimize loss), summed over the same items.
  auto aux = model.take_auxiliary_loss();
  if (aux.defined()) total = total + aux;
  return total;
}

// The cloze (BERT4Rec-style) version of a next-item batch. Under left padding pos is the
// whole training sequence right-aligned (pos[j] = input[j + 1], the last slot the last
// training item), and neg[j] a negative for pos[j]. Each real slot is masked with probability
// mask_prob, keyed by (seed, epoch, user, slot from the right) so the masks do not depend on
// the number of ranks; a row with no masked slot gets its last slot masked. Masked slots
// become targets; the rest are inputs only.
io::TrainBatch cloze_batch(const io::TrainBatch& b, double mask_prob, uint64_t seed, int64_t mask_item) {
  constexpr uint64_t kClozeTag = 0xc102e5eedull;
  io::TrainBatch c = b;
  c.input = b.pos.clone();
  c.pos = torch::zeros_like(b.pos);
  c.neg = torch::zeros_like(b.neg);
  const int64_t n = b.pos.size(0), L = b.pos.size(1);
  const auto* src = b.pos.data_ptr<int64_t>();
  const auto* neg = b.neg.data_ptr<int64_t>();
  const auto* user = b.users.data_ptr<int64_t>();
  auto* in = c.input.data_ptr<int64_t>();
  auto* tg = c.pos.data_ptr<int64_t>();
  auto* ng = c.neg.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    io::KeyedRng rng(seed, kClozeTag ^ static_cast<uint64_t>(b.cursor.epoch), static_cast<uint64_t>(user[r]));
    bool any = false;
    for (int64_t j = L - 1; j >= 0 && src[r * L + j] != 0; --j) {
      if (rng.uniform() >= mask_prob) continue;
      const int64_t k = r * L + j;
      tg[k] = src[k];
      ng[k] = neg[k];
      in[k] = mask_item;
      any = true;
    }
    const int64_t last = r * L + L - 1;
    if (!any && src[last] != 0) {
      tg[last] = src[last];
      ng[last] = neg[last];
      in[last] = mask_item;
    }
  }
  return c;
}

std::string fmt(double v, int precision = 4) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(precision) << v;
  return s.str();
}

// How parameters are spread over the ranks. Without expert parallelism every parameter is
// replicated on every rank. With --expert_parallel P, consecutive groups of P ranks each hold
// all E experts of every mixture-of-experts layer, E/P per rank (keys carry global expert ids);
// the ranks holding the same experts in different groups form a replica group.
struct Layout {
  std::unique_ptr<dist::Comm> ep_owned, replicas_owned;
  dist::Comm* ep = nullptr;        // this rank's expert-parallel group; null without EP
  dist::Comm* replicas = nullptr;  // the ranks holding this rank's experts; null when alone
  std::set<std::string> experts;   // sharded parameter names (expert parallel only)
  // The model runs collectives inside forward (the MoE's global token counts), so every rank
  // must run every forward and backward, empty batches included.
  bool lockstep = false;

  bool sharded(const std::string& name) const { return experts.count(name) > 0; }
};

// Group 0 of the expert-parallel layout gathers every expert's tensor, so that rank 0 writes
// all experts under their global ids (a run saved at P ranks loads at any other layout).
// `local` is in the same order on every rank (E/P experts of equal shapes each).
void gather_experts(dist::Comm& ep, const std::vector<std::pair<std::string, at::Tensor>>& local,
                    std::vector<std::pair<std::string, at::Tensor>>& out) {
  std::string names;
  for (auto& [n, t] : local) names += n + "\n";
  const auto all_names = ep.all_gather_string(names);
  for (size_t i = 0; i < local.size(); ++i) {
    auto all = ep.all_gather(local[i].second.detach().contiguous());
    for (int r = 0; r < ep.size(); ++r) {
      std::istringstream in(all_names[r]);
      std::string n;
      for (size_t j = 0; j <= i; ++j) std::getline(in, n);
      out.emplace_back(n, all[r].clone());
    }
  }
}

TensorBundle make_snapshot(models::SequenceModel& model, const Adam& adam, const io::Cursor& cursor,
                           const Progress& p, const TrainOptions& o, const LrSchedule& schedule, int world,
                           const Layout& layout, int rank) {
  TensorBundle b;
  std::vector<std::pair<std::string, at::Tensor>> experts;
  for (auto& [n, t] : model.named_parameters()) {
    if (layout.sharded(n)) experts.emplace_back("param/" + n, t.detach());
    else b.tensors.emplace_back("param/" + n, t.detach());
  }
  for (auto& [n, t] : model.named_buffers()) b.tensors.emplace_back("buffer/" + n, t.detach());
  for (auto& [n, t] : adam.state()) {
    const auto slash = n.find('/');
    if (slash != std::string::npos && layout.sharded(n.substr(slash + 1))) experts.emplace_back("adam/" + n, t);
    else b.tensors.emplace_back("adam/" + n, t);
  }
  // Only group 0 (which holds rank 0, the writer) gathers; the other groups hold replicas.
  if (layout.ep && rank < layout.ep->size()) gather_experts(*layout.ep, experts, b.tensors);
  b.meta["kind"] = "seqrec-train-state";
  b.meta["step"] = std::to_string(p.step);
  b.meta["cursor_epoch"] = std::to_string(cursor.epoch);
  b.meta["cursor_step"] = std::to_string(cursor.step);
  b.meta["evaluated_epochs"] = std::to_string(p.evaluated_epochs);
  std::ostringstream best;
  best.precision(17);
  best << p.best_value;
  b.meta["best_value"] = best.str();
  b.meta["best_epoch"] = std::to_string(p.best_epoch);
  b.meta["bad_evals"] = std::to_string(p.bad_evals);
  b.meta["train_seconds"] = std::to_string(p.train_seconds);
  b.meta["model_signature"] = models::model_signature(model.options());
  b.meta["config"] = o.config_text;
  b.meta["dataset"] = o.data;
  b.meta["world_size"] = std::to_string(world);
  b.meta["global_batch"] = std::to_string(o.loader.batch_size * world);
  b.meta["train_windows"] = o.loader.windows ? "true" : "false";
  b.meta["train_prefixes"] = o.loader.prefixes ? "true" : "false";
  b.meta["lr_schedule"] = schedule.describe();
  b.meta["build"] = io::describe_build();
  return b;
}

void load_parameters(models::SequenceModel& model, const TensorBundle& b, const std::string& where) {
  torch::NoGradGuard no_grad;
  auto copy = [&](const std::string& key, at::Tensor t) {
    if (!b.has_tensor(key)) throw std::runtime_error(where + ": checkpoint has no tensor '" + key + "'");
    const auto& src = b.tensor(key);
    if (src.sizes() != t.sizes())
      throw std::runtime_error(where + ": tensor '" + key + "' has shape " + c10::str(src.sizes()) +
                               " in the checkpoint, the model expects " + c10::str(t.sizes()));
    t.copy_(src);
  };
  for (auto& [n, t] : model.named_parameters()) copy("param/" + n, t);
  for (auto& [n, t] : model.named_buffers()) copy("buffer/" + n, t);
}

void check_model_signature(const TensorBundle& b, const models::ModelOptions& mine, const std::string& where) {
  const std::string theirs = b.value("model_signature");
  const std::string diff = models::signature_difference(theirs, models::model_signature(mine));
  if (!diff.empty())
    throw std::runtime_error(where + " was written by a different model configuration (checkpoint vs this run):\n" +
                             diff);
}

// A checkpoint directory, or a directory of them (then its newest complete one).
std::string resolve_checkpoint(const std::string& path, dist::Comm& comm) {
  if (fs::exists(fs::path(path) / "COMPLETE") || fs::exists(fs::path(path) / "MANIFEST")) return path;
  CheckpointManager mgr({path, 1}, comm);
  auto latest = mgr.latest();
  if (!latest) {
    if (fs::is_directory(fs::path(path) / "checkpoints") || fs::is_directory(fs::path(path) / "best"))
      throw std::runtime_error("'" + path + "' is a run directory: name its best/ (the validation-selected model) or "
                               "checkpoints/ (the newest complete checkpoint)");
    throw std::runtime_error("no complete checkpoint in '" + path + "'");
  }
  return *latest;
}

// Fault injection for the tests of the replica checks: SEQREC_FAULT_DIVERGE=RANK:STEP[:NAME]
// makes rank RANK add 1e-3 to the first element of parameter or buffer NAME (default: the
// first parameter) right after update STEP, as a rank-local bug or a flipped bit would.
// Unset in normal use; a malformed value is an error rather than silently nothing.
struct DivergeFault {
  int rank = -1;
  int64_t step = -1;
  std::string name;
};

DivergeFault diverge_fault_from_env() {
  DivergeFault f;
  const char* env = std::getenv("SEQREC_FAULT_DIVERGE");
  if (!env || !*env) return f;
  const std::string v = env;
  const auto bad = [&v] {
    return std::invalid_argument("SEQREC_FAULT_DIVERGE='" + v + "': expected RANK:STEP[:NAME], e.g. 1:4 or 1:4:item_emb.weight");
  };
  const auto c1 = v.find(':');
  if (c1 == std::string::npos) throw bad();
  const auto c2 = v.find(':', c1 + 1);
  try {
    size_t used = 0;
    f.rank = std::stoi(v.substr(0, c1), &used);
    if (used != c1) throw bad();
    const std::string step = v.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1);
    f.step = std::stoll(step, &used);
    if (used != step.size()) throw bad();
  } catch (const std::logic_error&) {
    throw bad();
  }
  if (f.rank < 0 || f.step < 1) throw bad();
  if (c2 != std::string::npos) f.name = v.substr(c2 + 1);
  return f;
}

// The tensor SEQREC_FAULT_DIVERGE names (checked at setup on every rank, so a wrong name fails
// everywhere at once).
at::Tensor fault_target(models::SequenceModel& model, const DivergeFault& f) {
  auto params = model.named_parameters();
  if (f.name.empty()) return params.front().second;
  for (auto& named : {params, model.named_buffers()})
    for (auto& [n, t] : named)
      if (n == f.name) return t;
  throw std::invalid_argument("SEQREC_FAULT_DIVERGE: the model has no parameter or buffer '" + f.name + "'");
}

void inject_divergence(models::SequenceModel& model, const DivergeFault& f) {
  torch::NoGradGuard no_grad;
  fault_target(model, f).view(-1)[0] += 1e-3;
}

// --device for this rank. Several ranks on CUDA spread over their node's devices: "cuda" puts
// local rank r on device r mod the visible count (one GPU per rank where the node has enough,
// ranks sharing one where it has fewer), "cuda:N" puts every rank on device N. Their
// collectives run on the MPI backend, staged through host memory (dist/comm.h).
at::Device run_device(const std::string& text, const dist::Comm& comm) {
  at::Device device = parse_device_name(text);
  check_device_usable(device, text);
  if (device.is_cuda() && comm.size() > 1 && text == "cuda")
    device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(comm.local_rank() % torch::cuda::device_count()));
  use_device(device);
  return device;
}

}  // namespace

// The model's options with the dataset's values (items, users, user features), validated, and
// the expert-parallel layout checked against the world size: what the flags get wrong fails
// here, before run_training makes the run directory.
static models::ModelOptions checked_model_options(const TrainOptions& o, const io::DatasetMeta& meta, int world) {
  models::ModelOptions mo = o.model;
  mo.num_items = meta.num_items;
  mo.num_users = meta.num_users;
  mo.user_feature_cardinalities = meta.user_feature_cardinalities;
  mo.max_len = o.loader.max_len;
  models::validate(mo);
  const int P = o.expert_parallel;
  if (P < 1 || world % P != 0)
    throw std::invalid_argument("--expert_parallel " + std::to_string(P) + " must divide the number of ranks (" +
                                std::to_string(world) + ")");
  if (P > 1 && !models::has_moe(mo))
    throw std::invalid_argument("--expert_parallel needs a mixture-of-experts model (--model flash4rec with "
                                "--moe_experts > 0)");
  if (P > 1 && mo.moe_experts % P != 0)
    throw std::invalid_argument("--moe_experts " + std::to_string(mo.moe_experts) +
                                " is not divisible by --expert_parallel " + std::to_string(P));
  return mo;
}

// The run proper, once the run directory is this invocation's (run_training below).
static TrainSummary train_run(const TrainOptions& o, const models::ModelOptions& mo, const io::DatasetMeta& meta,
                              const at::Device& device, dist::Comm& comm, RunLog& log) {
  const int rank = comm.rank(), world = comm.size();
  const DivergeFault fault = diverge_fault_from_env();

  if (o.label_smoothing != 0 && !(o.loss == "ce" && o.label_smoothing > 0 && o.label_smoothing < 1))
    throw std::invalid_argument("--label_smoothing " + fmt(o.label_smoothing, 3) +
                                ": must be in [0, 1), and applies to --loss ce only (this run: --loss " + o.loss + ")");
  const io::UserSequences seqs = io::load_shards(o.data, meta, rank, world);
  Layout layout;
  const int P = o.expert_parallel;
  const bool moe = models::has_moe(mo);
  const int64_t length_groups = o.length_groups > 0 ? o.length_groups : device.is_cpu() ? 8 : 1;
  models::ModelRuntime runtime;
  // The loss slices batches by length for every model but a mixture of experts, which runs
  // whole; its attention slices them instead.
  if (moe) runtime.attention_length_groups = length_groups;
  if (moe && world > 1) {
    runtime.world = &comm;
    layout.lockstep = true;
  }
  if (P > 1) {
    if (P == world) {
      layout.ep = &comm;
    } else {
      layout.ep_owned = comm.split(rank / P, rank);
      layout.ep = layout.ep_owned.get();
    }
    if (world > P) {
      layout.replicas_owned = comm.split(rank % P, rank);
      layout.replicas = layout.replicas_owned.get();
    }
    runtime.expert_group = layout.ep;
  }
  auto model = models::make_model(mo, runtime);
  // Built (and initialised) on the CPU, identically on every rank and device, then moved.
  if (!device.is_cpu()) model->to(device);
  if (P > 1)
    for (auto& n : model->expert_parameters()) layout.experts.insert(n);
  auto named = model->named_parameters();
  std::vector<at::Tensor> replicated, sharded;
  int64_t num_params = 0;
  for (auto& [n, t] : named) {
    (layout.sharded(n) ? sharded : replicated).push_back(t);
    num_params += t.numel();
    // Defined, zeroed gradients: a rank with no examples in a step still all-reduces zeros.
    t.mutable_grad() = torch::zeros_like(t);
  }
  // Experts are initialised from their global ids, identical wherever they live.
  dist::broadcast_parameters(comm, replicated, 0);
  Adam adam(named, o.adam);
  // Training windows or prefixes: every rank needs every user's example count; each knows its
  // own users'.
  std::vector<int64_t> examples_per_user;
  if (o.loader.windows || o.loader.prefixes) {
    auto counts = torch::zeros({meta.num_users}, torch::kFloat64);  // exact below 2^53
    auto* c = counts.data_ptr<double>();
    for (int64_t u = seqs.user_begin; u < seqs.user_end; ++u)
      c[u] = static_cast<double>(io::examples_of(seqs.length(u), o.loader));
    comm.all_reduce(counts);
    examples_per_user.resize(meta.num_users);
    for (int64_t u = 0; u < meta.num_users; ++u) examples_per_user[u] = std::llround(c[u]);
  }
  // The last-slot objective attends both ways within an example, so every slot but the last
  // sees its own target: only the last slot is one.
  io::LoaderOptions loader_options = o.loader;
  loader_options.last_target_only = mo.objective == "last";
  io::TrainLoader loader(seqs, meta, loader_options, rank, world, std::move(examples_per_user));
  std::vector<double> popularity;
  if (o.select_protocol.popularity || (o.loss == "sampled" && o.loss_sampler == "popularity"))
    popularity = item_popularity(seqs, meta, comm);
  std::unique_ptr<LossSampler> loss_sampler;
  at::Tensor loss_log_expected;
  if (o.loss == "sampled") {
    loss_sampler = std::make_unique<LossSampler>(o.loss_sampler, o.loss_negatives, meta.num_items, o.seed, popularity);
    loss_log_expected = loss_sampler->log_expected().to(device);
  }
  const LrSchedule schedule = lr_schedule_of(o, loader.steps_per_epoch());

  CheckpointManager ckpt({o.out + "/checkpoints", o.keep_checkpoints}, comm);
  CheckpointManager best_ckpt({o.out + "/best", 1}, comm);
  // The in-model random streams (dropout, MoE noise) of this rank, on the host and the device.
  const uint64_t rank_seed = o.seed * 1000003ull + static_cast<uint64_t>(rank);
  const auto seed_streams = [&](uint64_t seed) {
    seed_generator(seed);
    seed_device_generator(device, seed);
  };
  seed_streams(rank_seed);

  Progress p;
  std::optional<std::string> resume_from;
  if (o.resume == "auto") {
    resume_from = ckpt.latest();
    if (!resume_from) log.line("[resume] no complete checkpoint in " + o.out + "/checkpoints: starting fresh");
  } else if (!o.resume.empty()) {
    resume_from = resolve_checkpoint(o.resume, comm);
  }
  if (resume_from) {
    auto loaded = ckpt.load(*resume_from);
    const auto& s = loaded.shared;
    if (!s.meta.count("kind") || s.value("kind") != "seqrec-train-state")
      throw std::runtime_error(*resume_from + " is not a seqrec training checkpoint");
    check_model_signature(s, mo, *resume_from);
    load_parameters(*model, s, *resume_from);
    std::vector<std::pair<std::string, at::Tensor>> adam_state;
    for (auto& [n, t] : s.tensors)
      if (n.rfind("adam/", 0) == 0) adam_state.emplace_back(n.substr(5), t);
    adam.load_state(adam_state);
    p.step = std::stoll(s.value("step"));
    p.evaluated_epochs = std::stoll(s.value("evaluated_epochs"));
    p.best_value = std::stod(s.value("best_value"));
    p.best_epoch = std::stoll(s.value("best_epoch"));
    p.bad_evals = std::stoll(s.value("bad_evals"));
    p.train_seconds = std::stod(s.value("train_seconds"));
    io::Cursor c{std::stoll(s.value("cursor_epoch")), std::stoll(s.value("cursor_step"))};
    // The cursor indexes an epoch's examples, which windows and prefixes change: no silent
    // remapping.
    for (const auto& [key, now] : {std::pair<std::string, bool>{"train_windows", o.loader.windows},
                                   std::pair<std::string, bool>{"train_prefixes", o.loader.prefixes}}) {
      const bool saved = s.meta.count(key) && s.value(key) == "true";
      if (saved != now)
        throw std::runtime_error(*resume_from + " was trained " + (saved ? "with" : "without") + " --" + key +
                                 "; resume it " + (saved ? "with" : "without") + " the flag (or start a new --out)");
    }
    // A decaying schedule is planned over the run's epochs: resuming under another plan (say a
    // raised --epochs) would jump the learning rate, so it is refused rather than silently taken.
    // Two constant rates may differ (as before the key existed); checkpoints written before it
    // trained at a constant rate. A run still at its constant rate (a constant schedule, or a
    // decay planned to begin after its step: a plateaued run annealed earlier than planned) may
    // go on under a decay that begins at or after its step (--lr_decay_from_epoch): up to there
    // both rates are the constant one.
    const std::string saved_schedule =
        s.meta.count("lr_schedule") ? s.value("lr_schedule") : "constant (written before --lr_schedule existed)";
    const bool saved_held_to_step = held_until(saved_schedule) >= p.step;
    const bool continues = saved_held_to_step && (schedule.kind == "constant" || schedule.decay_begin() >= p.step);
    if (!continues && saved_schedule != schedule.describe())
      throw std::runtime_error(*resume_from + " was trained with the learning-rate schedule '" + saved_schedule +
                               "'; this run's flags give '" + schedule.describe() +
                               "': resume with the saved run's --lr, --lr_schedule, --lr_final_ratio, --warmup_steps, "
                               "--lr_decay_from_epoch and --epochs" +
                               (saved_held_to_step ? ", or with a decay that begins at or after its step " +
                                                         std::to_string(p.step) + " (--lr_decay_from_epoch)"
                                                   : std::string()) +
                               " (or start a new --out)");
    // The cursor counts global batches of the saved run's size: with another global batch
    // (world size or per-rank batch changed) continue the epoch from the same example offset.
    // Checkpoints written before the key existed held the per-rank batch of this configuration.
    const int saved_world = loaded.saved_world_size;
    const int64_t global = o.loader.batch_size * world;
    const int64_t saved_global = s.meta.count("global_batch")
                                     ? std::stoll(s.value("global_batch"))
                                     : o.loader.batch_size * saved_world;
    if (saved_global != global)
      c.step = std::min(loader.steps_per_epoch() - 1, c.step * saved_global / global);
    const uint64_t resumed_seed = rank_seed + 7919ull * static_cast<uint64_t>(p.step);
    if (saved_world != world) {
      log.line("[resume] saved with " + std::to_string(saved_world) + " ranks, resuming with " +
               std::to_string(world) + ": dropout streams re-seeded");
      seed_streams(resumed_seed);
    } else if (loaded.per_rank && loaded.per_rank->has_tensor("rng/cpu")) {
      set_generator_state(loaded.per_rank->tensor("rng/cpu"));
      // A checkpoint written on another device type has no state for this one: re-seeded.
      if (loaded.per_rank->has_tensor("rng/cuda") && device.is_cuda())
        set_device_generator_state(device, loaded.per_rank->tensor("rng/cuda"));
      else
        seed_device_generator(device, resumed_seed);  // a no-op on the CPU
    }
    loader.seek(c);
    log.line("[resume] " + *resume_from + ": step " + std::to_string(p.step) + ", epoch " +
             std::to_string(c.epoch) + " batch " + std::to_string(c.step));
    // Not an error (fixes and speed-ups land between sittings), but a run's figures then come
    // from more than one build, which its log should say.
    if (!s.meta.count("build") || s.value("build") != io::describe_build())
      log.line("[resume] the checkpoint was written by " +
               (s.meta.count("build") ? s.value("build") : std::string("a build that did not record itself")) +
               "; this sitting runs " + io::describe_build());
  }

  log.line("[setup] dataset=" + meta.name + " users=" + std::to_string(meta.num_users) +
           " items=" + std::to_string(meta.num_items) + " events=" + std::to_string(meta.num_events) +
           " ranks=" + std::to_string(world) + " threads/rank=" + std::to_string(at::get_num_threads()) +
           " device=" + device.str());
  log.line("[setup] build: " + io::describe_build());
  log.line("[setup] machine: " + describe_machine(device) + (world > 1 ? " (rank 0's)" : ""));
  if (ops::matmul_precision() == "high")
    log.line(std::string("[setup] matmul_precision=high") +
             (device.is_cuda() ? ": float32 products on TensorFloat-32 tensor cores"
                               : ": applies to CUDA devices only; this CPU run computes float32 throughout"));
  if (ops::matmul_precision() == "medium")
    log.line(std::string("[setup] matmul_precision=medium: the layers', attention's and loss's products on bfloat16 "
                         "operands, float32 accumulation") +
             (device.is_cuda() || ops::cpu_has_bf16_dot()
                  ? ""
                  : "; this CPU has no AVX-512 BF16, so oneDNN emulates them (expect them slower than float32)"));
  if (!o.allocator.empty()) log.line("[setup] allocator: " + o.allocator);
  log.line(std::string("[setup] split: ") + io::kSplitRule);
  log.line("[setup] model=" + mo.model + " params=" + std::to_string(num_params) + " max_len=" +
           std::to_string(mo.max_len) + " hidden=" + std::to_string(mo.hidden) + " blocks=" +
           std::to_string(mo.blocks) + " heads=" + std::to_string(mo.heads) + " objective=" + mo.objective +
           " attention=" + (models::bidirectional(mo) ? "bidirectional" : "causal") + " loss=" + o.loss +
           " batch/rank=" + std::to_string(o.loader.batch_size) +
           (o.loader.windows    ? " examples=windows of max_len"
            : o.loader.prefixes ? " examples=every prefix"
                                : " examples=one per user") +
           " steps/epoch=" +
           std::to_string(loader.steps_per_epoch()) + " length_groups=" + std::to_string(length_groups));
  if (const auto own = models::own_options_text(mo); !own.empty()) log.line("[setup] " + mo.model + ": " + own);
  if (loss_sampler) log.line("[setup] loss: sampled softmax over the target and " + loss_sampler->describe());
  if (o.label_smoothing > 0)
    log.line("[setup] loss: softmax over all items with label smoothing " + fmt(o.label_smoothing, 3) +
             " (the target's share 1 - eps, eps spread over the " + std::to_string(meta.num_items) +
             " items; the logged loss includes it)");
  log.line("[setup] learning rate: " + schedule.describe());
  if (schedule.kind != "constant" && !schedule.decays())
    log.line("[setup] warning: " +
             (schedule.decay_start > schedule.warmup_steps
                  ? "the decay would begin at step " + std::to_string(schedule.decay_start) + " (--lr_decay_from_epoch " +
                        std::to_string(o.lr_decay_from_epoch) + "), at or past"
                  : "the " + std::to_string(schedule.warmup_steps) + " warm-up steps outlast") +
             " the run's " + std::to_string(schedule.decay_end) + " planned steps (--epochs x steps per epoch), so the " +
             schedule.kind + " decay never runs; lower --warmup_steps or --lr_decay_from_epoch, or raise --epochs");
  log.line("[setup] model selection: valid " + o.select_metric + " under \"" + o.select_protocol.describe() + "\"");
  if (fault.step > 0) {
    if (fault.rank >= world)
      throw std::invalid_argument("SEQREC_FAULT_DIVERGE: rank " + std::to_string(fault.rank) + " is not among the " +
                                  std::to_string(world) + " rank(s)");
    fault_target(*model, fault);
    log.line("[fault] SEQREC_FAULT_DIVERGE: rank " + std::to_string(fault.rank) + " perturbs '" +
             (fault.name.empty() ? model->named_parameters().front().first : fault.name) + "' after step " +
             std::to_string(fault.step) + " (a test of the replica checks)");
  }

  TrainSummary summary;
  reset_device_peak(device);
  int64_t last_saved_step = resume_from ? p.step : -1;
  const int64_t steps_per_epoch = loader.steps_per_epoch();
  // Parameters and statistics-driven buffers (EMA centroids and codebooks) must be equal on
  // every rank; a rank that diverged would otherwise go unnoticed until its checkpoint.
  auto check_replicas = [&](const std::string& when) {
    if (world == 1) return;
    std::vector<std::pair<std::string, at::Tensor>> shared, experts;
    for (auto& [n, t] : model->named_parameters()) (layout.sharded(n) ? experts : shared).emplace_back(n, t);
    for (auto& b : model->named_buffers()) shared.push_back(b);
    dist::check_replicas_identical(comm, shared, when);
    if (layout.replicas) dist::check_replicas_identical(*layout.replicas, experts, when);
  };
  auto save_checkpoint = [&] {
    check_replicas("before the checkpoint at step " + std::to_string(p.step));
    TensorBundle rng{{{"rng/cpu", generator_state()}}, {}};
    if (device.is_cuda()) rng.tensors.emplace_back("rng/cuda", device_generator_state(device));
    ckpt.save(p.step, make_snapshot(*model, adam, loader.cursor(), p, o, schedule, world, layout, rank), rng);
    last_saved_step = p.step;
  };
  auto evaluate_and_log = [&](Split split, const EvalProtocol& proto, int64_t epoch) {
    SEQREC_PROFILE_SCOPE("seqrec::evaluation");
    EvalOptions eval = o.eval;
    eval.lockstep = layout.lockstep;
    auto r = evaluate(*model, seqs, meta, split, proto, eval, comm, popularity.empty() ? nullptr : &popularity);
    log.line(format_result(r, meta.name, epoch));
    log.metrics(result_json(r, meta.name, epoch, p.step));
    return r;
  };

  // Interval accumulators for the progress line (this rank's share; reduced when printed).
  double loss_acc = 0, targets_acc = 0, users_acc = 0;
  auto interval_start = Clock::now();
  bool stop_signal = false;
  // --profile_steps: steps of this sitting run under Torch's profiler, after a warm-up.
  int64_t sitting_steps = 0;
  double sitting_seconds = 0;  // this sitting's training time: its rate, not the run's, gives the ETA
  bool profiling = false;
  auto profile_start = Clock::now();
  int64_t profile_first_step = 0;
  auto finish_profile = [&] {
    const double wall_us = seconds_since(profile_start) * 1e6;
    const auto profile = stop_profile();
    profiling = false;
    const int64_t steps = p.step - profile_first_step;
    const std::string what = std::to_string(steps) + " training step(s), " + std::to_string(profile_first_step + 1) +
                             " to " + std::to_string(p.step) + ", rank " + std::to_string(rank) + ", " +
                             std::to_string(at::get_num_threads()) + " thread(s)";
    const std::string path = o.out + "/profile-rank" + std::to_string(rank) + ".txt";
    std::ofstream(path) << "profile of " << what << " (times in ms, all ops)\n" << format_profile(profile, wall_us, 1 << 30, 25);
    if (rank == 0) {
      log.line("[profile] " + what + ", " + fmt(wall_us / 1000.0 / std::max<int64_t>(steps, 1), 1) +
               " ms per step; every op in " + path + "; the largest by self time:");
      std::istringstream table(format_profile(profile, wall_us, 15));
      for (std::string line; std::getline(table, line);) log.line("[profile] " + line);
    }
  };
  for (;;) {
    const io::Cursor c = loader.cursor();
    const bool epoch_boundary = c.step == 0 && c.epoch > 0;

    // 1. Validate (and select) at epoch boundaries.
    if (epoch_boundary && c.epoch > p.evaluated_epochs &&
        (c.epoch % o.eval_every == 0 || c.epoch >= o.epochs)) {
      auto r = evaluate_and_log(Split::kValid, o.select_protocol, c.epoch);
      if (o.also_full_ranking && o.select_protocol.sampled) {
        EvalProtocol full;
        full.sampled = false;
        evaluate_and_log(Split::kValid, full, c.epoch);
      }
      if (const auto state = model->describe_state(); !state.empty()) log.line("[model] " + state);
      const double v = r.get(o.select_metric);
      p.evaluated_epochs = c.epoch;
      if (v > p.best_value) {
        p.best_value = v;
        p.best_epoch = c.epoch;
        p.bad_evals = 0;
        best_ckpt.save(p.step, make_snapshot(*model, adam, c, p, o, schedule, world, layout, rank), TensorBundle{});
        log.line("[select] new best valid " + o.select_metric + "=" + fmt(v) + " at epoch " + std::to_string(c.epoch));
      } else {
        ++p.bad_evals;
      }
      model->set_training(true);
    }

    // 2. Checkpoint.
    const bool periodic = o.checkpoint_every > 0 && p.step > 0 && p.step % o.checkpoint_every == 0;
    if ((periodic || (epoch_boundary && p.evaluated_epochs == c.epoch)) && last_saved_step != p.step)
      save_checkpoint();

    // 3. Stop?
    const bool done_epochs = c.epoch >= o.epochs;
    const bool patience_out = o.patience > 0 && p.bad_evals >= o.patience;
    const bool step_limit = o.max_steps > 0 && p.step >= o.max_steps;
    if (done_epochs || patience_out || step_limit || stop_signal) {
      if (last_saved_step != p.step) save_checkpoint();
      if (patience_out) log.line("[stop] no improvement in " + std::to_string(o.patience) + " validations");
      if (stop_signal) log.line("[stop] stop requested: checkpoint written at step " + std::to_string(p.step));
      summary.stopped_by_signal = stop_signal;
      break;
    }

    // 4. One training step.
    if (o.profile_steps > 0 && sitting_steps == o.profile_after && !profiling) {
      start_profile();
      profiling = true;
      profile_start = Clock::now();
      profile_first_step = p.step;
    }
    const auto t_step = Clock::now();
    model->set_training(true);
    io::TrainBatch batch = [&] {
      SEQREC_PROFILE_SCOPE("seqrec::loader");
      return loader.next();
    }();
    if (mo.objective == "cloze") batch = cloze_batch(batch, o.mask_prob, o.seed, models::mask_item(mo));
    if (!device.is_cpu()) {  // the user ids stay on the host, where user_input reads them
      batch.input = batch.input.to(device);
      batch.pos = batch.pos.to(device);
      batch.neg = batch.neg.to(device);
    }
    const double local_targets = static_cast<double>(batch.pos.ne(0).sum().item<int64_t>());
    // One small all-reduce: global target count, stop flag, and rank 0's "print now".
    auto control = torch::tensor({local_targets, (o.stop_requested && o.stop_requested()) ? 1.0 : 0.0,
                                  (rank == 0 && seconds_since(interval_start) >= o.log_every_seconds) ? 1.0 : 0.0},
                                 torch::kFloat64);
    if (world > 1) comm.all_reduce(control);
    const double global_targets = std::max(1.0, control[0].item<double>());
    stop_signal = control[1].item<double>() > 0;
    const bool print_now = control[2].item<double>() > 0;

    double local_loss = 0;
    if (local_targets > 0 || layout.lockstep) {
      const auto users = on_device(user_input(batch.users, seqs, meta), device);
      at::Tensor loss;
      {
        SEQREC_PROFILE_SCOPE("seqrec::forward");
        LossSample sample;
        if (loss_sampler) sample = {loss_sampler->draw(p.step).to(device), loss_log_expected};
        loss = batch_loss_sum(*model, batch, users, o.loss, o.label_smoothing, length_groups, /*whole=*/moe,
                              /*last_only=*/loader_options.last_target_only, local_targets,
                              std::min<int64_t>(o.softmax_keep_mib, int64_t{1} << 40) << 20, sample) /
               global_targets;
      }
      {
        SEQREC_PROFILE_SCOPE("seqrec::backward");
        loss.backward();
      }
      local_loss = loss.item<double>() * global_targets;
    }
    if (world > 1) {
      SEQREC_PROFILE_SCOPE("seqrec::gradient_all_reduce");
      // The loss is already divided by the global target count, so the sum of the ranks'
      // gradients is the gradient of the global mean. An expert's gradient is complete on its
      // owner (its group's tokens came to it); replicas in other groups add theirs.
      std::vector<at::Tensor> grads, expert_grads;
      for (auto& t : replicated) grads.push_back(t.grad());
      for (auto& t : sharded) expert_grads.push_back(t.grad());
      dist::all_reduce_sum_(comm, grads);
      if (layout.replicas) dist::all_reduce_sum_(*layout.replicas, expert_grads);
    }
    if (o.clip_norm > 0) {
      // The global norm counts each expert once: its group's sum of the sharded squares.
      double extra = 0;
      if (layout.ep && !sharded.empty()) {
        auto sq = torch::zeros({1}, torch::kFloat64);
        for (auto& t : sharded) sq += t.grad().to(torch::kFloat64).pow(2).sum().cpu();
        layout.ep->all_reduce(sq);
        extra = sq.item<double>();
      }
      clip_grad_norm(replicated, o.clip_norm, extra, sharded);
    }
    {
      SEQREC_PROFILE_SCOPE("seqrec::optimizer");
      adam.step(schedule.at(p.step));
      adam.zero_grad();
    }
    // Statistics-driven updates (EMA codebooks): every rank's sums, all-reduced, then applied
    // identically everywhere, so N ranks x batch b update as 1 rank x batch N·b.
    if (auto stats = model->pending_statistics(); !stats.empty()) {
      if (world > 1) dist::all_reduce_sum_(comm, stats);
      model->apply_statistics();
    }
    ++p.step;
    ++sitting_steps;
    if (profiling && sitting_steps == o.profile_after + o.profile_steps) finish_profile();
    if (fault.step == p.step && fault.rank == rank) inject_divergence(*model, fault);
    if (o.replica_check_every > 0 && p.step % o.replica_check_every == 0)
      check_replicas("at step " + std::to_string(p.step));
    const double step_seconds = seconds_since(t_step);
    p.train_seconds += step_seconds;
    sitting_seconds += step_seconds;
    loss_acc += local_loss;
    targets_acc += local_targets;
    users_acc += static_cast<double>(batch.input.size(0));

    // 5. Progress line.
    if (print_now) {
      auto acc = torch::tensor({loss_acc, targets_acc, users_acc}, torch::kFloat64);
      auto rss = torch::tensor({resident_mib()}, torch::kFloat64);
      if (world > 1) {
        comm.all_reduce(acc);
        comm.all_reduce(rss, dist::ReduceOp::kMax);
      }
      const double dt = seconds_since(interval_start);
      const io::Cursor n = loader.cursor();
      const double done = static_cast<double>(n.epoch * steps_per_epoch + n.step);
      const double total = static_cast<double>(o.epochs * steps_per_epoch);
      // This sitting's rate: a run resumed on another machine or thread count (a GPU run
      // continued on a CPU) would otherwise be promised its earlier sittings' speed.
      const double per_step = sitting_seconds / static_cast<double>(std::max<int64_t>(1, sitting_steps));
      log.line("[train] epoch " + std::to_string(n.epoch + (n.step > 0 ? 1 : 0)) + "/" + std::to_string(o.epochs) +
               " step " + std::to_string(p.step) + " loss " + fmt(acc[0].item<double>() / std::max(1.0, acc[1].item<double>())) +
               " lr " + fmt(schedule.at(p.step), 6) + " seq/s " + fmt(acc[2].item<double>() / dt, 0) +
               " ETA(epochs) " + format_duration(per_step * (total - done)) + " RSS/rank " +
               fmt(rss.item<double>(), 0) + " MiB");
      loss_acc = targets_acc = users_acc = 0;
      interval_start = Clock::now();
    }
  }

  if (profiling) finish_profile();  // the run ended before the profiled steps did
  summary.steps = p.step;
  summary.epochs_completed = loader.cursor().epoch;
  summary.best_epoch = p.best_epoch;
  summary.best_valid = p.best_value;
  summary.seconds_per_epoch =
      p.step > 0 ? p.train_seconds / (static_cast<double>(p.step) / steps_per_epoch) : 0.0;
  // Peak resident memory of this process (this sitting only: a resumed run starts afresh),
  // the largest over the ranks.
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  auto peak = torch::tensor({static_cast<double>(usage.ru_maxrss) / 1024.0}, torch::kFloat64);  // KiB -> MiB
  if (world > 1) comm.all_reduce(peak, dist::ReduceOp::kMax);
  summary.peak_rss_mib = peak.item<double>();
  summary.peak_device_mib = device_peak_mib(device);
  log.line("[done] steps=" + std::to_string(p.step) + " train time/epoch=" + fmt(summary.seconds_per_epoch, 2) +
           " s peak RSS/rank=" + fmt(summary.peak_rss_mib, 0) + " MiB" +
           (device.is_cuda() ? " peak GPU memory allocated=" + fmt(summary.peak_device_mib, 0) + " MiB" : "") +
           // The figure above averages every sitting of a resumed run, which may have run elsewhere.
           (sitting_steps > 0 && sitting_steps < p.step
                ? "; this sitting " + fmt(sitting_seconds / (static_cast<double>(sitting_steps) / steps_per_epoch), 2) +
                      " s/epoch over " + std::to_string(sitting_steps) + " steps"
                : ""));
  if (host_allocator_installed()) {  // this rank's; in-use and cached blocks are part of the RSS above
    const auto h = host_allocator_stats();
    const auto mib = [](int64_t b) { return fmt(static_cast<double>(b) / (1 << 20), 0); };
    log.line("[done] host allocator: peak in use " + mib(h.peak_in_use_bytes) + " MiB, cached " +
             mib(h.cached_bytes) + " MiB, " + std::to_string(h.maps) + " maps, " + std::to_string(h.unmaps) +
             " unmaps, " + std::to_string(h.reuses) + " reuses");
  }

  // 6. The test split, once, with the model selected on validation.
  const bool finished = !summary.stopped_by_signal && !(o.max_steps > 0 && p.step >= o.max_steps &&
                                                         loader.cursor().epoch < o.epochs);
  if (o.final_test && finished) {
    if (auto best = best_ckpt.latest()) {
      load_parameters(*model, best_ckpt.load(*best).shared, *best);
      log.line("[test] model selected on valid " + o.select_metric + " at epoch " + std::to_string(p.best_epoch));
    } else {
      log.line("[test] no validation was run: testing the final model");
    }
    evaluate_and_log(Split::kTest, o.select_protocol, p.best_epoch);
    if (o.also_full_ranking && o.select_protocol.sampled) {
      EvalProtocol full;
      full.sampled = false;
      evaluate_and_log(Split::kTest, full, p.best_epoch);
    }
  }
  return summary;
}

TrainSummary run_training(const TrainOptions& o, dist::Comm& comm) {
  // Ranks of one job run one build as well as one configuration: two binaries may differ in
  // what a flag means or how a kernel sums.
  dist::check_same_config(comm, "build: " + io::describe_build() + "\n" + o.config_text);
  // A missing dataset, or a protocol it cannot serve, fails before anything is written (and
  // not at the first validation).
  const io::DatasetMeta meta = io::read_meta(o.data);
  check_protocol(o.select_protocol, meta);
  const models::ModelOptions mo = checked_model_options(o, meta, comm.size());
  const at::Device device = run_device(o.device, comm);  // fails before anything is written
  // A directory that holds a run's checkpoints belongs to that run: without --resume nothing
  // in it is touched, flags.txt and train.log included.
  if (o.resume.empty() && CheckpointManager({o.out + "/checkpoints", 1}, comm).latest())
    throw std::runtime_error("run directory " + o.out +
                             " already holds checkpoints: pass --resume auto to continue it, or a new --out");
  // Every rank learns whether rank 0 got the directory, so that all of them stop together.
  RunDirLock lock;
  std::string lock_error;
  if (comm.rank() == 0) {
    std::error_code ec;
    fs::create_directories(o.out, ec);
    lock_error = ec ? "cannot create the run directory " + o.out + ": " + ec.message() : lock.acquire(o.out);
  }
  auto locked = torch::tensor({lock_error.empty() ? 1.0 : 0.0}, torch::kFloat64);
  if (comm.size() > 1) comm.broadcast(locked, 0);
  if (locked.item<double>() == 0.0)
    throw std::runtime_error(comm.rank() == 0 ? lock_error : "rank 0 could not take the run directory " + o.out);
  if (comm.rank() == 0) {
    std::ofstream flags(o.out + "/flags.txt");
    flags << o.config_text;
    if (!flags) throw std::runtime_error("cannot write " + o.out + "/flags.txt");
  }
  comm.barrier();
  RunLog log(o.out, comm.rank() == 0);
  // From here on the directory is this run's: what ends it early is also written to its log,
  // where `seqrec info RUN` finds it.
  try {
    return train_run(o, mo, meta, device, comm, log);
  } catch (const std::exception& e) {
    log.record("[error] ", e.what());
    throw;
  }
}

InferenceModel load_for_inference(const std::string& checkpoint_dir, const std::string& data, dist::Comm& comm,
                                  const std::string& device_name, const std::string& tag) {
  const at::Device device = run_device(device_name, comm);
  InferenceModel m;
  m.checkpoint = resolve_checkpoint(checkpoint_dir, comm);
  const std::string& dir = m.checkpoint;
  CheckpointManager mgr({checkpoint_dir, 1}, comm);
  auto loaded = mgr.load(dir);
  auto mo = models::parse_model_signature(loaded.shared.value("model_signature"));
  // Without --data, the dataset the checkpoint was trained on, as its run named it (a relative
  // path is relative to where that run was started).
  m.data = data;
  if (m.data.empty()) {
    if (!loaded.shared.meta.count("dataset") || loaded.shared.value("dataset").empty())
      throw std::invalid_argument(dir + " does not record the dataset it was trained on; pass --data");
    m.data = loaded.shared.value("dataset");
    if (!fs::is_directory(m.data))
      throw std::invalid_argument("--data not given, and the dataset " + dir + " was trained on, '" + m.data +
                                  "', is not a directory here (a relative path is relative to where the run "
                                  "was started); pass --data");
    if (comm.rank() == 0)
      std::fprintf(stderr, "[%s] --data not given: the checkpoint's dataset, %s\n", tag.c_str(), m.data.c_str());
  }
  m.meta = io::read_meta(m.data);
  if (mo.num_items != m.meta.num_items)
    throw std::runtime_error(dir + " was trained on " + std::to_string(mo.num_items) + " items, dataset " + m.data +
                             " has " + std::to_string(m.meta.num_items));
  m.seqs = io::load_shards(m.data, m.meta, comm.rank(), comm.size());
  m.model = models::make_model(mo);
  if (!device.is_cpu()) m.model->to(device);
  load_parameters(*m.model, loaded.shared, dir);
  // The epoch the checkpoint's model was trained to (-1 when the checkpoint does not say).
  m.epoch = loaded.shared.meta.count("cursor_epoch") ? std::stoll(loaded.shared.value("cursor_epoch")) : -1;
  return m;
}

void run_evaluation(const std::string& checkpoint_dir, const std::string& data, Split split,
                    const EvalProtocol& protocol, const EvalOptions& eval, dist::Comm& comm,
                    const std::string& device_name) {
  InferenceModel m = load_for_inference(checkpoint_dir, data, comm, device_name, "eval");
  std::vector<double> popularity;
  if (protocol.sampled && protocol.popularity) popularity = item_popularity(m.seqs, m.meta, comm);
  EvalOptions e = eval;
  e.max_len = m.model->options().max_len;
  auto r = evaluate(*m.model, m.seqs, m.meta, split, protocol, e, comm, popularity.empty() ? nullptr : &popularity);
  if (comm.rank() == 0) std::printf("%s\n", format_result(r, m.meta.name, m.epoch).c_str());
}

}  // namespace seqrec::train
