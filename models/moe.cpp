#include "models/moe.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <stdexcept>

#include "dist/autograd.h"
#include "ops/dropout/dropout.h"
#include "ops/products.h"

namespace seqrec::models {
namespace {

using ops::mix64;
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// Derived seed for (seed, a, b): distinct streams per expert and per use.
uint64_t derive(uint64_t seed, uint64_t a, uint64_t b) {
  return mix64(mix64(seed ^ kGolden) + mix64(a * kGolden + 0x632BE59BD9B4E019ull) + b * 0xD1B54A32D192ED03ull);
}

// [T, E] standard normals, entry (t, e) a function of (seed, offset + t, e) only: Box-Muller
// on the two 32-bit halves of one hash per entry.
at::Tensor token_noise(int64_t T, int64_t E, int64_t offset, uint64_t seed) {
  auto out = torch::empty({T, E}, torch::kFloat64);
  double* p = out.data_ptr<double>();
  const uint64_t base = mix64(seed ^ 0xA0761D6478BD642Full);
  const double two_pi = 6.283185307179586476925286766559;
  const double inv32 = 1.0 / 4294967296.0;
  at::parallel_for(0, T, 256, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t e = 0; e < E; ++e) {
        const uint64_t idx = static_cast<uint64_t>(offset + t) * static_cast<uint64_t>(E) + static_cast<uint64_t>(e);
        const uint64_t r = mix64(base + idx * kGolden);
        const double u1 = (static_cast<double>(r >> 32) + 0.5) * inv32;          // (0, 1)
        const double u2 = (static_cast<double>(r & 0xFFFFFFFFull) + 0.5) * inv32;
        p[t * E + e] = std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2);
      }
  });
  return out;
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  auto c = t.to(torch::kInt64).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

}  // namespace

void validate(const MoeOptions& o) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("MoeOptions." + what); };
  if (o.dim <= 0) fail("dim must be positive, got " + std::to_string(o.dim));
  if (o.inner <= 0) fail("inner (expert hidden width) must be positive, got " + std::to_string(o.inner));
  if (o.experts <= 0) fail("experts must be positive, got " + std::to_string(o.experts));
  if (o.top_k < 1 || o.top_k > o.experts)
    fail("top_k must be in [1, experts = " + std::to_string(o.experts) + "], got " + std::to_string(o.top_k));
  if (!(o.capacity_factor > 0) || !std::isfinite(o.capacity_factor))
    fail("capacity_factor must be a positive finite number, got " + std::to_string(o.capacity_factor));
  if (!(o.noise_eps >= 0) || !std::isfinite(o.noise_eps))
    fail("noise_eps must be finite and >= 0, got " + std::to_string(o.noise_eps));
  if (!(o.balance_coef >= 0) || !std::isfinite(o.balance_coef))
    fail("balance_coef must be finite and >= 0, got " + std::to_string(o.balance_coef));
  if (o.activation != "relu" && o.activation != "gelu")
    fail("activation must be relu or gelu, got '" + o.activation + "'");
  if (!(o.dropout >= 0 && o.dropout < 1)) fail("dropout must be in [0, 1), got " + std::to_string(o.dropout));
  const int P = o.ep ? o.ep->size() : 1;
  if (P > 1) {
    if (o.experts % P != 0)
      fail("experts (" + std::to_string(o.experts) + ") must be divisible by the expert-parallel size (ep has " +
           std::to_string(P) + " ranks)");
    if (!o.world)
      fail("world must be set when the expert-parallel group (ep) has " + std::to_string(P) +
           " ranks: token order and capacity are global");
    if (o.world->size() % P != 0)
      fail("world size (" + std::to_string(o.world->size()) + ") must be a multiple of the expert-parallel size (" +
           std::to_string(P) + ")");
  }
}

MoeFeedForwardImpl::MoeFeedForwardImpl(const MoeOptions& options) : o_(options) {
  validate(o_);
  if (!o_.world) own_world_ = dist::make_local_comm();
  if (!o_.ep || o_.ep->size() == 1) own_ep_ = dist::make_local_comm();
  world_ = o_.world ? o_.world : own_world_.get();
  ep_ = own_ep_ ? own_ep_.get() : o_.ep;
  local_experts_ = o_.experts / ep_->size();
  first_expert_ = static_cast<int64_t>(ep_->rank()) * local_experts_;

  w_gate_ = register_parameter("w_gate", torch::zeros({o_.dim, o_.experts}));
  if (o_.noisy) w_noise_ = register_parameter("w_noise", torch::zeros({o_.dim, o_.experts}));
  {
    // Linear's default initialisation draws from the default generator, and ranks build
    // different numbers of local experts: restore its state so that construction draws nothing
    // (initialise below sets every value).
    auto gen = at::detail::getDefaultCPUGenerator();
    auto state = gen.get_state();
    for (int64_t i = 0; i < local_experts_; ++i) {
      Expert e;
      e.id = first_expert_ + i;
      auto holder = register_module("expert" + std::to_string(e.id), std::make_shared<torch::nn::Module>());
      e.fc1 = holder->register_module("fc1", torch::nn::Linear(o_.dim, o_.inner));
      e.fc2 = holder->register_module("fc2", torch::nn::Linear(o_.inner, o_.dim));
      experts_.push_back(std::move(e));
    }
    gen.set_state(state);
  }
  initialise(o_.init_seed);
}

void MoeFeedForwardImpl::initialise(uint64_t seed) {
  torch::NoGradGuard no_grad;
  w_gate_.zero_();
  if (w_noise_.defined()) w_noise_.zero_();
  auto xavier = [](at::Tensor& w, at::Generator& gen) {
    const double fan_out = w.size(0), fan_in = w.size(1);
    const double std = std::sqrt(2.0 / (fan_in + fan_out));
    w.copy_(at::normal(0.0, std, w.sizes(), gen, w.options()));
  };
  for (auto& e : experts_) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(derive(seed, static_cast<uint64_t>(e.id), 0));
    xavier(e.fc1->weight, gen);
    xavier(e.fc2->weight, gen);
    e.fc1->bias.zero_();
    e.fc2->bias.zero_();
  }
}

at::Tensor MoeFeedForwardImpl::take_auxiliary_loss() {
  auto out = aux_;
  aux_ = at::Tensor();
  return out;
}

std::vector<at::Tensor> MoeFeedForwardImpl::gate_parameters() const {
  std::vector<at::Tensor> out{w_gate_};
  if (w_noise_.defined()) out.push_back(w_noise_);
  return out;
}

std::vector<at::Tensor> MoeFeedForwardImpl::expert_parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& e : experts_)
    for (auto* l : {&e.fc1, &e.fc2}) {
      out.push_back((*l)->weight);
      out.push_back((*l)->bias);
    }
  return out;
}

int64_t MoeFeedForwardImpl::expert_of_parameter(const std::string& key) {
  static const std::string prefix = "expert";
  if (key.compare(0, prefix.size(), prefix) != 0) return -1;
  size_t i = prefix.size();
  int64_t id = 0;
  const size_t start = i;
  while (i < key.size() && key[i] >= '0' && key[i] <= '9') id = id * 10 + (key[i++] - '0');
  if (i == start || i >= key.size() || key[i] != '.') return -1;
  return id;
}

// FFN_e on `rows` [n, d]; `slots` [n] (CPU int64) are the rows' slots in expert e, which key
// the dropout masks: the mask of (e, slot) is row `slot` of ops::dropout_mask over the expert's
// [slots, width] buffer, whatever rank computes it.
at::Tensor MoeFeedForwardImpl::run_expert(Expert& e, const at::Tensor& rows, const at::Tensor& slots,
                                          uint64_t dropout_seed) {
  const bool drop = is_training() && o_.dropout > 0 && rows.size(0) > 0;
  at::Tensor slot_index;
  int64_t buffer = 0;
  if (drop) {
    buffer = slots.max().item<int64_t>() + 1;
    slot_index = slots.to(rows.device());
  }
  auto masked = [&](const at::Tensor& h, uint64_t use) {
    if (!drop) return h;
    auto like = at::empty({buffer, h.size(1)}, h.options());
    auto mask = ops::dropout_mask(like, o_.dropout, derive(dropout_seed, static_cast<uint64_t>(e.id), use));
    return h * mask.index_select(0, slot_index);
  };
  auto a = ops::linear(rows, e.fc1->weight, e.fc1->bias);
  auto h = masked(o_.activation == "gelu" ? torch::gelu(a) : torch::relu(a), 1);
  return masked(ops::linear(h, e.fc2->weight, e.fc2->bias), 2);
}

at::Tensor MoeFeedForwardImpl::forward(const at::Tensor& x, const at::Tensor& priority) {
  if (!x.defined() || x.dim() != 2 || x.size(1) != o_.dim) {
    std::string shape = x.defined() ? c10::str(x.sizes()) : "undefined";
    throw std::invalid_argument("MoeFeedForward: input must be [T, " + std::to_string(o_.dim) + "], got " + shape);
  }
  if (priority.defined() && (priority.dim() != 1 || priority.size(0) != x.size(0) || priority.scalar_type() != torch::kInt64))
    throw std::invalid_argument("MoeFeedForward: priority must be int64 [T = " + std::to_string(x.size(0)) + "], got " +
                                c10::str(priority.sizes()) + " " + c10::toString(priority.scalar_type()));
  const int64_t T = x.size(0), E = o_.experts, k = o_.top_k, d = o_.dim;
  const bool train = is_training();
  const auto cpu_long = torch::TensorOptions().dtype(torch::kInt64);
  // Draws from the default generator, the same on every rank whatever its tokens.
  const bool noise = train && o_.noisy;
  const uint64_t noise_seed = noise ? ops::random_seed() : 0;
  const uint64_t dropout_seed = train && o_.dropout > 0 ? ops::random_seed() : 0;

  // Global token order: this rank's tokens follow those of the lower world ranks.
  const auto tokens = to_vector(world_->all_gather(torch::full({1}, T, cpu_long)).view({-1}));
  const int me = world_->rank();
  int64_t offset = 0, total = 0;
  for (size_t r = 0; r < tokens.size(); ++r) {
    if (static_cast<int>(r) < me) offset += tokens[r];
    total += tokens[r];
  }

  // Gating.
  auto logits = x.matmul(w_gate_);
  auto H = logits;
  if (noise) {
    auto n = token_noise(T, E, offset, noise_seed).to(x.options());
    H = logits + n * (torch::softplus(x.matmul(w_noise_)) + o_.noise_eps);
  }
  auto probs = torch::softmax(H, -1);
  // Stable descending sort: among equal values the lower expert id comes first.
  auto choices = std::get<1>(H.detach().sort(/*stable=*/true, /*dim=*/-1, /*descending=*/true)).narrow(1, 0, k);
  auto choices_cpu = choices.to(torch::kCPU).contiguous();  // [T, k]

  // Slots: choice rank j before token order; counts of every rank all-gathered.
  auto local_counts = torch::zeros({k, E}, cpu_long);
  for (int64_t j = 0; j < k; ++j) local_counts[j] = torch::bincount(choices_cpu.select(1, j), {}, E);
  auto all_counts = world_->all_gather(local_counts);                   // [W, k, E]
  auto totals = all_counts.sum(0);                                      // [k, E]
  auto base = totals.cumsum(0) - totals + all_counts.narrow(0, 0, me).sum(0);  // slots taken before ours
  auto slots = torch::empty({T, k}, cpu_long);
  if (priority.defined()) {
    // Token order by key: every rank sees every (key, choices) row, sorts them the same way,
    // and keeps the slots of its own rows. Rows are padded to the largest rank's count.
    const int64_t most = *std::max_element(tokens.begin(), tokens.end());
    auto mine = torch::full({most, 1 + k}, -1, cpu_long);
    mine.narrow(0, 0, T).select(1, 0).copy_(priority.to(torch::kCPU));
    mine.narrow(0, 0, T).narrow(1, 1, k).copy_(choices_cpu);
    auto all = world_->all_gather(mine);  // [W, most, 1 + k]
    std::vector<at::Tensor> rows;
    for (size_t r = 0; r < tokens.size(); ++r) rows.push_back(all[r].narrow(0, 0, tokens[r]));
    auto flat = torch::cat(rows);  // [total, 1 + k], rank-major
    auto order = std::get<1>(flat.select(1, 0).sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
    auto sorted = flat.index_select(0, order);
    for (int64_t j = 0; j < k; ++j) {
      auto c = sorted.select(1, 1 + j).contiguous();
      auto within = (torch::one_hot(c, E).cumsum(0) - 1).gather(1, c.unsqueeze(1)).squeeze(1);
      auto global = torch::empty({total}, cpu_long).index_put_({order}, totals.narrow(0, 0, j).sum(0).index_select(0, c) + within);
      slots.select(1, j).copy_(global.narrow(0, offset, T));
    }
  } else {
    for (int64_t j = 0; j < k; ++j) {
      auto c = choices_cpu.select(1, j);
      auto within = (torch::one_hot(c, E).cumsum(0) - 1).gather(1, c.unsqueeze(1)).squeeze(1);
      slots.select(1, j).copy_(base[j].index_select(0, c) + within);
    }
  }
  // ceil with a little slack so that an exact product (1.1·60/6 = 11) is not rounded up.
  // Evaluation is dropless: a score must not depend on which users share its batch.
  const double exact = o_.capacity_factor * static_cast<double>(k) * static_cast<double>(total) / static_cast<double>(E);
  const int64_t capacity = total == 0 ? 0
                           : train   ? static_cast<int64_t>(std::ceil(exact - 1e-9))
                                     : total * k;
  auto dropped = slots.ge(capacity);
  last_dropped_ = dropped;
  last_choices_ = choices_cpu;
  last_capacity_ = capacity;

  // Switch load-balancing term, a sum over this rank's tokens.
  if (train) {
    auto f = totals[0].to(torch::kFloat64) / static_cast<double>(std::max<int64_t>(total, 1));
    auto term = (probs.sum(0) * f.to(probs.options())).sum() * (o_.balance_coef * static_cast<double>(E));
    aux_ = aux_.defined() ? aux_ + term : term;
  }

  // Kept assignments, flat index t·k + j, ordered by (expert, slot): grouped by owner.
  auto kept = dropped.view({-1}).logical_not().nonzero().view({-1});
  auto expert_of = choices_cpu.view({-1}).index_select(0, kept);
  auto slot_of = slots.view({-1}).index_select(0, kept);
  auto order = (expert_of * std::max<int64_t>(capacity, 1) + slot_of).argsort();
  kept = kept.index_select(0, order);
  expert_of = expert_of.index_select(0, order);
  slot_of = slot_of.index_select(0, order);
  auto token_of = kept.div(k, "floor");

  const int P = ep_->size();
  auto send_counts = to_vector(torch::bincount(expert_of.div(local_experts_, "floor"), {}, P));
  auto device_token = token_of.to(x.device());
  auto meta = torch::stack({expert_of, slot_of}, 1).contiguous();  // [n, 2]
  std::vector<int64_t> recv_counts;
  auto recv_meta = ep_->all_to_all(meta, send_counts, &recv_counts);
  auto recv_rows = dist::all_to_all_differentiable(*ep_, x.index_select(0, device_token), send_counts);

  // Local experts on the rows they received (every expert runs, on 0 rows if need be, so that
  // its gradients are always defined).
  const int64_t m = recv_rows.size(0);
  auto recv_expert = recv_meta.select(1, 0), recv_slot = recv_meta.select(1, 1);
  std::vector<at::Tensor> outs, rows_of;
  for (auto& e : experts_) {
    auto idx = recv_expert.eq(e.id).nonzero().view({-1});
    rows_of.push_back(idx);
    outs.push_back(run_expert(e, recv_rows.index_select(0, idx.to(x.device())), recv_slot.index_select(0, idx),
                              dropout_seed));
  }
  auto placed = torch::cat(rows_of);
  if (placed.size(0) != m)
    throw std::logic_error("MoeFeedForward: received rows for experts this rank does not own");
  auto inverse = torch::empty_like(placed).scatter_(0, placed, torch::arange(m, cpu_long));
  auto out_rows = torch::cat(outs).index_select(0, inverse.to(x.device()));

  // Results return to the tokens' ranks in the order they were sent.
  auto back = dist::all_to_all_differentiable(*ep_, out_rows, recv_counts);
  auto gate = probs.gather(1, choices).reshape({-1}).index_select(0, kept.to(x.device()));
  return torch::zeros({T, d}, x.options()).index_add(0, device_token, back * gate.unsqueeze(1));
}

}  // namespace seqrec::models
