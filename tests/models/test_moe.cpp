// The mixture-of-experts feed-forward layer (models/moe.h), run as 1 process and under
// mpirun -np 2 / 3. The central check: an expert-parallel layer over the world (E = 6 experts
// split over the ranks, each rank holding an uneven slice of the tokens, possibly none) computes
// exactly what one process computes on all the tokens — outputs, dropped assignments, auxiliary
// loss, input, gate and expert gradients — in float64 to 1e-12 (relative to the values' scale).
// Then single-process properties: the dense mixture when nothing drops, the priority order of
// capacity dropping, T = 0, option errors, initialisation by global expert id.
// Collectives come before assertions so a failing rank never strands the others.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cstdlib>
#include <map>

#include "dist/autograd.h"
#include "dist/comm.h"
#include "models/moe.h"

namespace {
using namespace seqrec;
using models::MoeFeedForward;
using models::MoeFeedForwardImpl;
using models::MoeOptions;

dist::Comm& world() {
  static std::unique_ptr<dist::Comm> c = dist::make_comm("auto");
  return *c;
}
dist::Comm& local() {
  static std::unique_ptr<dist::Comm> c = dist::make_local_comm();
  return *c;
}

constexpr double kTol = 1e-12;  // float64 comparisons: max |a - b| <= kTol * (1 + max |b|)

::testing::AssertionResult close(const at::Tensor& a, const at::Tensor& b, double tol = kTol) {
  if (!a.defined() || !b.defined()) return ::testing::AssertionFailure() << "undefined tensor";
  if (a.sizes() != b.sizes()) return ::testing::AssertionFailure() << "shapes " << a.sizes() << " vs " << b.sizes();
  if (a.numel() == 0) return ::testing::AssertionSuccess();
  const double scale = 1 + b.abs().max().item<double>();
  const double diff = (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
  if (diff <= tol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |diff| " << diff << " > " << tol * scale;
}

MoeOptions options(int64_t k, bool noisy) {
  MoeOptions o;
  o.dim = 5;
  o.inner = 7;
  o.experts = 6;
  o.top_k = k;
  o.capacity_factor = 0.5;
  o.noisy = noisy;
  o.balance_coef = 0.05;
  o.init_seed = 11;
  return o;
}

at::Tensor normal(c10::IntArrayRef shape, double std, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::normal(0.0, std, shape, gen, torch::TensorOptions().dtype(torch::kFloat64));
}

// Random gates, the same on every rank (the zero initialisation sends every token to expert 0
// when there is no noise, which tests little).
void set_gates(MoeFeedForward& m, uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto params = m->named_parameters();
  auto& g = params["w_gate"];
  g.copy_(normal(g.sizes(), 1.0, seed));
  if (auto* n = params.find("w_noise")) n->copy_(normal(n->sizes(), 0.5, seed + 1));
}

MoeFeedForward build(MoeOptions o, dist::Comm* comm, uint64_t gate_seed, dist::Comm* ep = nullptr) {
  o.world = comm;
  o.ep = ep ? ep : comm;
  MoeFeedForward m(o);
  m->to(torch::kFloat64);
  m->initialise(o.init_seed);
  set_gates(m, gate_seed);
  return m;
}

// Uneven slices of `total` tokens over P ranks (rank r weighted r + 1); with `with_empty`, one
// rank (rank 0 at P = 2, rank 1 otherwise) holds none.
std::vector<int64_t> slices(int64_t total, int P, bool with_empty) {
  std::vector<int64_t> s(P, 0);
  if (P == 1) return {total};
  const int empty = with_empty ? (P == 2 ? 0 : 1) : -1;
  int64_t weights = 0;
  for (int r = 0; r < P; ++r)
    if (r != empty) weights += r + 1;
  int64_t given = 0, last = -1;
  for (int r = 0; r < P; ++r)
    if (r != empty) {
      s[r] = total * (r + 1) / weights;
      given += s[r];
      last = r;
    }
  s[last] += total - given;
  return s;
}

struct Step {
  at::Tensor y, dropped, x_grad, aux;
  std::map<std::string, at::Tensor> grads;
};

// One training step: forward with the default generator seeded to `rng`, then backward of
// Σ y·w + aux.
Step step(MoeFeedForward& m, const at::Tensor& x, const at::Tensor& w, uint64_t rng) {
  Step s;
  auto xi = x.clone().requires_grad_(true);
  torch::manual_seed(rng);
  s.y = m->forward(xi);
  s.dropped = m->last_dropped().clone();
  s.aux = m->take_auxiliary_loss();
  ((s.y * w).sum() + s.aux).backward();
  s.x_grad = xi.grad().clone();
  for (auto& p : m->named_parameters())
    s.grads[p.key()] = p.value().grad().defined() ? p.value().grad().clone() : at::Tensor();
  return s;
}

struct Case {
  int64_t k;
  bool noisy;
  bool with_empty;
  double dropout;
  std::string activation;
};

std::string describe(const Case& c) {
  return "k=" + std::to_string(c.k) + " noisy=" + std::to_string(c.noisy) + " empty_rank=" +
         std::to_string(c.with_empty) + " dropout=" + std::to_string(c.dropout) + " " + c.activation +
         " rank=" + std::to_string(world().rank()) + "/" + std::to_string(world().size());
}

TEST(Moe, ExpertParallelEqualsSingleProcess) {
  const int P = world().size(), me = world().rank();
  const int64_t total = 37;
  const std::vector<Case> cases = {
      {1, false, false, 0.0, "relu"}, {1, true, false, 0.0, "relu"}, {2, false, false, 0.0, "gelu"},
      {2, true, false, 0.0, "relu"},  {2, true, false, 0.2, "relu"}, {1, true, true, 0.0, "relu"},
      {2, true, true, 0.1, "gelu"},
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const auto& c = cases[ci];
    auto o = options(c.k, c.noisy);
    o.dropout = c.dropout;
    o.activation = c.activation;
    auto ref = build(o, &local(), 100 + ci);
    auto ep = build(o, &world(), 100 + ci);
    ref->train();
    ep->train();
    auto X = normal({total, o.dim}, 1.0, 7 + ci), W = normal({total, o.dim}, 1.0, 9 + ci);
    const auto s = slices(total, P, c.with_empty);
    int64_t offset = 0;
    for (int r = 0; r < me; ++r) offset += s[r];
    const int64_t T = s[me];

    const uint64_t rng = 1234 + ci;
    auto want = step(ref, X, W, rng);
    auto got = step(ep, X.narrow(0, offset, T), W.narrow(0, offset, T), rng);

    // Collectives: the auxiliary loss and the replicated gates' gradients summed over ranks.
    auto aux_sum = got.aux.detach().clone().reshape({1}).contiguous();
    world().all_reduce(aux_sum);
    std::map<std::string, at::Tensor> gate_sum;
    for (const char* key : {"w_gate", "w_noise"}) {
      if (!got.grads.count(key)) continue;
      auto g = got.grads[key].defined() ? got.grads[key].contiguous() : torch::zeros({o.dim, o.experts}, torch::kFloat64);
      world().all_reduce(g);
      gate_sum[key] = g;
    }

    SCOPED_TRACE(describe(c));
    const auto kept_rows = [&](const at::Tensor& t) { return t.narrow(0, offset, T); };
    // The capacity factor 0.5 must drop something, and keep something, in the single process.
    const int64_t ref_dropped = want.dropped.sum().item<int64_t>();
    EXPECT_GT(ref_dropped, 0);
    EXPECT_LT(ref_dropped, want.dropped.numel());
    EXPECT_EQ(ep->last_capacity(), ref->last_capacity());
    EXPECT_TRUE(torch::equal(got.dropped, kept_rows(want.dropped)));
    EXPECT_TRUE(close(got.y, kept_rows(want.y))) << "outputs";
    EXPECT_TRUE(close(got.x_grad, kept_rows(want.x_grad))) << "input gradients";
    ASSERT_TRUE(want.aux.defined());
    ASSERT_TRUE(got.aux.defined());
    EXPECT_TRUE(close(aux_sum[0], want.aux.detach())) << "auxiliary loss";
    EXPECT_GT(want.aux.item<double>(), 0.0);
    for (auto& [key, g] : gate_sum) EXPECT_TRUE(close(g, want.grads[key])) << key << " gradient";
    EXPECT_EQ(gate_sum.size(), c.noisy ? 2u : 1u);

    // Local experts: registered under their global ids, gradients equal the reference's.
    int64_t experts_seen = 0;
    for (auto& [key, g] : got.grads) {
      const int64_t e = MoeFeedForwardImpl::expert_of_parameter(key);
      if (e < 0) continue;
      ++experts_seen;
      EXPECT_GE(e, ep->first_local_expert());
      EXPECT_LT(e, ep->first_local_expert() + ep->num_local_experts());
      ASSERT_TRUE(want.grads.count(key)) << key;
      EXPECT_TRUE(close(g, want.grads[key])) << key << " gradient";
    }
    EXPECT_EQ(experts_seen, 4 * o.experts / P);
    EXPECT_EQ(ep->num_local_experts(), o.experts / P);
    EXPECT_EQ(ep->first_local_expert(), me * o.experts / P);
  }
}

// Expert-parallel groups inside the world (Comm::split): groups of g ranks for every g dividing
// the world size, so the experts are replicated over P/g groups (g = 1: pure data parallelism,
// every expert on every rank). Outputs equal the reference's rows, and an expert's gradients
// summed over its replicas (the ranks with the same expert-parallel rank) equal the reference's.
TEST(Moe, ExpertParallelGroupsInsideTheWorld) {
  const int P = world().size(), me = world().rank();
  const int64_t total = 31;
  for (int g = 1; g <= P; ++g) {
    if (P % g != 0) continue;
    auto group = world().split(me / g, me % g);
    auto replicas = world().split(me % g, me);
    auto o = options(2, true);
    o.dropout = 0.1;
    auto ref = build(o, &local(), 70 + g);
    auto ep = build(o, &world(), 70 + g, group.get());
    ref->train();
    ep->train();
    auto X = normal({total, o.dim}, 1.0, 17 + g), W = normal({total, o.dim}, 1.0, 19 + g);
    const auto s = slices(total, P, false);
    int64_t offset = 0;
    for (int r = 0; r < me; ++r) offset += s[r];
    const int64_t T = s[me];
    auto want = step(ref, X, W, 99 + g);
    auto got = step(ep, X.narrow(0, offset, T), W.narrow(0, offset, T), 99 + g);
    std::map<std::string, at::Tensor> summed;
    for (auto& [key, grad] : got.grads) {
      auto t = grad.contiguous();
      if (MoeFeedForwardImpl::expert_of_parameter(key) >= 0) replicas->all_reduce(t);
      else world().all_reduce(t);
      summed[key] = t;
    }
    SCOPED_TRACE("group size " + std::to_string(g) + " rank " + std::to_string(me) + "/" + std::to_string(P));
    EXPECT_EQ(ep->num_local_experts(), o.experts / g);
    EXPECT_EQ(ep->first_local_expert(), (me % g) * o.experts / g);
    EXPECT_GT(want.dropped.sum().item<int64_t>(), 0);
    EXPECT_TRUE(torch::equal(got.dropped, want.dropped.narrow(0, offset, T)));
    EXPECT_TRUE(close(got.y, want.y.narrow(0, offset, T))) << "outputs";
    EXPECT_TRUE(close(got.x_grad, want.x_grad.narrow(0, offset, T))) << "input gradients";
    EXPECT_EQ(summed.size(), 2u + 4u * o.experts / g);
    for (auto& [key, grad] : summed) {
      ASSERT_TRUE(want.grads.count(key)) << key;
      EXPECT_TRUE(close(grad, want.grads[key])) << key << " gradient";
    }
  }
}

// Evaluation: no noise, no auxiliary term, same dispatch (capacity still applies).
TEST(Moe, ExpertParallelEqualsSingleProcessInEvaluation) {
  const int P = world().size(), me = world().rank();
  const int64_t total = 29;
  auto o = options(2, true);
  auto ref = build(o, &local(), 55), ep = build(o, &world(), 55);
  ref->eval();
  ep->eval();
  auto X = normal({total, o.dim}, 1.0, 3);
  const auto s = slices(total, P, false);
  int64_t offset = 0;
  for (int r = 0; r < me; ++r) offset += s[r];
  torch::NoGradGuard no_grad;
  auto want = ref->forward(X);
  auto got = ep->forward(X.narrow(0, offset, s[me]));
  EXPECT_TRUE(close(got, want.narrow(0, offset, s[me])));
  EXPECT_TRUE(torch::equal(ep->last_dropped(), ref->last_dropped().narrow(0, offset, s[me])));
  EXPECT_FALSE(ep->take_auxiliary_loss().defined());
  EXPECT_FALSE(ref->take_auxiliary_loss().defined());
}

// Initial expert weights depend on (seed, global expert id) only: the EP model's local experts
// equal the 1-rank model's experts of the same id; the gates start at zero.
TEST(Moe, InitialisationIsByGlobalExpertId) {
  auto o = options(1, true);
  o.world = o.ep = &world();
  MoeFeedForward ep(o);
  MoeOptions lo = options(1, true);
  MoeFeedForward single(lo);
  auto single_params = single->named_parameters();
  int64_t compared = 0;
  for (auto& p : ep->named_parameters()) {
    ASSERT_NE(single_params.find(p.key()), nullptr) << p.key();
    EXPECT_TRUE(torch::equal(p.value(), single_params[p.key()])) << p.key();
    if (MoeFeedForwardImpl::expert_of_parameter(p.key()) >= 0) ++compared;
  }
  EXPECT_EQ(compared, 4 * o.experts / world().size());
  EXPECT_EQ(single_params.size(), 2u + 4u * 6u);  // w_gate, w_noise, 6 experts x 4
  EXPECT_TRUE(torch::equal(single_params["w_gate"], torch::zeros({5, 6})));
  EXPECT_TRUE(torch::equal(single_params["w_noise"], torch::zeros({5, 6})));
  // Matrices are drawn (Xavier normal), biases zero, different experts differ, another seed differs.
  auto w0 = single_params["expert0.fc1.weight"].clone(), w1 = single_params["expert1.fc1.weight"];
  EXPECT_GT(w0.abs().sum().item<double>(), 0.0);
  EXPECT_FALSE(torch::equal(w0, w1));
  EXPECT_TRUE(torch::equal(single_params["expert2.fc2.bias"], torch::zeros({5})));
  const double var = w0.var().item<double>();
  EXPECT_NEAR(var, 2.0 / (5 + 7), 0.12);
  single->initialise(12);
  EXPECT_FALSE(torch::equal(single->named_parameters()["expert0.fc1.weight"], w0));
  // Construction and initialisation draw nothing from the default generator.
  torch::manual_seed(3);
  auto a = torch::rand({4});
  torch::manual_seed(3);
  MoeFeedForward again(lo);
  again->initialise(5);
  auto b = torch::rand({4});
  EXPECT_TRUE(torch::equal(a, b));
}

// The forward of the EP layer draws the same from the default generator on every rank, whatever
// its token count (so the ranks' generators stay alike).
TEST(Moe, RandomDrawsDoNotDependOnTokens) {
  auto o = options(2, true);
  o.dropout = 0.1;
  auto ep = build(o, &world(), 8);
  ep->train();
  const int me = world().rank();
  torch::manual_seed(77);
  auto x = normal({me == 0 ? 0 : 3 * me + 1, o.dim}, 1.0, 4 + me);
  auto y = ep->forward(x);
  y.sum().backward();
  auto after = torch::randint(0, 1 << 30, {1}, torch::kInt64);
  auto all = world().all_gather(after.contiguous());
  for (int r = 0; r < world().size(); ++r) EXPECT_EQ(all[r].item<int64_t>(), all[0].item<int64_t>());
}

// all_to_all_differentiable: the gradient of a sent row is the gradient of the row it became.
TEST(Moe, DifferentiableAllToAllRoutesGradientsBack) {
  const int me = world().rank(), P = world().size();
  auto count = [](int src, int dst) -> int64_t { return (src + 2 * dst + 1) % 3; };
  std::vector<int64_t> send_counts;
  for (int r = 0; r < P; ++r) send_counts.push_back(count(me, r));
  int64_t rows = 0;
  for (auto c : send_counts) rows += c;
  auto send = normal({rows, 3}, 1.0, 20 + me).requires_grad_(true);
  std::vector<int64_t> recv_counts;
  auto recv = dist::all_to_all_differentiable(world(), send, send_counts, &recv_counts);
  // Weight of row i of the block received from s: 100·me + 10·s + i.
  std::vector<at::Tensor> weights;
  for (int s = 0; s < P; ++s)
    weights.push_back((torch::arange(recv_counts[s], torch::kFloat64) + 100.0 * me + 10.0 * s).unsqueeze(1).expand({-1, 3}));
  auto weight = torch::cat(weights);
  (recv * weight).sum().backward();
  std::vector<at::Tensor> expected;
  for (int r = 0; r < P; ++r)
    expected.push_back((torch::arange(send_counts[r], torch::kFloat64) + 100.0 * r + 10.0 * me).unsqueeze(1).expand({-1, 3}));
  for (int s = 0; s < P; ++s) EXPECT_EQ(recv_counts[s], count(s, me));
  EXPECT_TRUE(torch::equal(send.grad(), torch::cat(expected)));
}

// ---- single-process properties (local comms, no collectives) ----

// With a capacity nothing exceeds, the layer is the explicit mixture Σ_{e in top-k} probs[e]·FFN_e(x)
// (probabilities over all experts, not renormalised), and the auxiliary term is
// α·E·Σ_e f_e·Σ_t probs_t[e].
TEST(Moe, LargeCapacityIsTheDenseMixture) {
  for (int64_t k : {1, 2, 6})
    for (std::string act : {"relu", "gelu"}) {
      SCOPED_TRACE("k=" + std::to_string(k) + " " + act);
      auto o = options(k, false);
      o.capacity_factor = 100;
      o.activation = act;
      auto m = build(o, nullptr, 31);
      m->train();
      auto x = normal({23, o.dim}, 1.0, 41);
      auto y = m->forward(x);
      auto aux = m->take_auxiliary_loss();
      EXPECT_FALSE(m->last_dropped().any().item<bool>());
      auto params = m->named_parameters();
      auto probs = torch::softmax(x.mm(params["w_gate"]), -1);
      auto top = std::get<1>(probs.topk(k, -1));
      auto chosen = torch::zeros_like(probs).scatter_(1, top, 1.0);
      auto want = torch::zeros_like(x);
      for (int64_t e = 0; e < o.experts; ++e) {
        const std::string p = "expert" + std::to_string(e) + ".";
        auto a = x.mm(params[p + "fc1.weight"].t()) + params[p + "fc1.bias"];
        auto h = act == "gelu" ? torch::gelu(a) : torch::relu(a);
        auto out = h.mm(params[p + "fc2.weight"].t()) + params[p + "fc2.bias"];
        want = want + (chosen.select(1, e) * probs.select(1, e)).unsqueeze(1) * out;
      }
      EXPECT_TRUE(close(y, want));
      auto f = torch::zeros({o.experts}, torch::kFloat64).scatter_add_(0, top.select(1, 0), torch::ones({23}, torch::kFloat64)) / 23.0;
      auto want_aux = o.balance_coef * o.experts * (f * probs.sum(0)).sum();
      ASSERT_TRUE(aux.defined());
      EXPECT_TRUE(close(aux, want_aux));
      EXPECT_TRUE(torch::equal(m->last_choices(), top));
    }
}

// Priority: all first choices in token order, then all second choices. Tokens 0-2 prefer
// expert 0 then 1, tokens 3-5 expert 1 then 0 (expert 2 last); C = ceil(0.5·2·6/3) = 2.
// Expert 0: first choices of tokens 0, 1 kept, token 2's dropped, every second choice dropped;
// likewise expert 1 with tokens 3, 4, 5.
TEST(Moe, CapacityDropsByChoiceRankThenTokenOrder) {
  MoeOptions o;
  o.dim = 2;
  o.inner = 4;
  o.experts = 3;
  o.top_k = 2;
  o.capacity_factor = 0.5;
  o.noisy = false;
  auto m = MoeFeedForward(o);
  m->to(torch::kFloat64);
  {
    torch::NoGradGuard no_grad;
    m->named_parameters()["w_gate"].copy_(torch::tensor({{2.0, 1.0, 0.0}, {1.0, 2.0, 0.0}}, torch::kFloat64));
  }
  m->train();
  auto x = torch::tensor({{1.0, 0.0}, {1.0, 0.0}, {1.0, 0.0}, {0.0, 1.0}, {0.0, 1.0}, {0.0, 1.0}}, torch::kFloat64);
  auto y = m->forward(x);
  EXPECT_EQ(m->last_capacity(), 2);
  auto want = torch::tensor({{false, true}, {false, true}, {true, true}, {false, true}, {false, true}, {true, true}});
  EXPECT_TRUE(torch::equal(m->last_dropped(), want)) << m->last_dropped();
  EXPECT_TRUE(torch::equal(m->last_choices(), torch::tensor({{0, 1}, {0, 1}, {0, 1}, {1, 0}, {1, 0}, {1, 0}}, torch::kInt64)));
  EXPECT_EQ(y[2].abs().sum().item<double>(), 0.0);
  EXPECT_EQ(y[5].abs().sum().item<double>(), 0.0);
  EXPECT_GT(y[0].abs().sum().item<double>(), 0.0);
  EXPECT_TRUE(close(y[0], y[1]));
}

// Top-1 with the probability as gate value: the task loss alone trains the gate (Switch fix).
TEST(Moe, TopOneGateLearnsFromTheTaskLoss) {
  auto o = options(1, false);
  o.capacity_factor = 2;
  o.balance_coef = 0;
  auto m = build(o, nullptr, 13);
  m->train();
  auto x = normal({16, o.dim}, 1.0, 1);
  (m->forward(x) * normal({16, o.dim}, 1.0, 2)).sum().backward();
  auto g = m->named_parameters()["w_gate"].grad();
  ASSERT_TRUE(g.defined());
  EXPECT_GT(g.abs().sum().item<double>(), 0.0);
}

TEST(Moe, NoTokens) {
  for (int64_t k : {1, 2}) {
    auto o = options(k, true);
    o.dropout = 0.1;
    auto m = build(o, nullptr, 3);
    m->train();
    auto x = torch::zeros({0, o.dim}, torch::kFloat64).requires_grad_(true);
    auto y = m->forward(x);
    EXPECT_EQ(y.sizes(), x.sizes());
    EXPECT_EQ(m->last_dropped().sizes(), (std::vector<int64_t>{0, k}));
    EXPECT_EQ(m->last_capacity(), 0);
    auto aux = m->take_auxiliary_loss();
    ASSERT_TRUE(aux.defined());
    EXPECT_EQ(aux.item<double>(), 0.0);
    (y.sum() + aux).backward();
    auto params = m->named_parameters();
    ASSERT_TRUE(params["w_gate"].grad().defined());
    EXPECT_EQ(params["w_gate"].grad().abs().sum().item<double>(), 0.0);
    ASSERT_TRUE(params["expert0.fc1.weight"].grad().defined());
  }
}

TEST(Moe, AuxiliaryLossAccumulatesAndClears) {
  auto o = options(2, false);
  auto m = build(o, nullptr, 4);
  auto x = normal({10, o.dim}, 1.0, 5);
  m->eval();
  m->forward(x);
  EXPECT_FALSE(m->take_auxiliary_loss().defined());
  m->train();
  m->forward(x);
  auto one = m->take_auxiliary_loss();
  EXPECT_FALSE(m->take_auxiliary_loss().defined());
  m->forward(x);
  m->forward(x);
  auto two = m->take_auxiliary_loss();
  ASSERT_TRUE(one.defined() && two.defined());
  EXPECT_TRUE(close(two, 2 * one));
}

// A Comm whose only use is its size (the options check never communicates).
class SizeOnlyComm : public dist::Comm {
 public:
  explicit SizeOnlyComm(int n) : n_(n) {}
  int rank() const override { return 0; }
  int size() const override { return n_; }
  std::string backend() const override { return "size-only"; }
  void all_reduce(at::Tensor&, dist::ReduceOp) override { fail(); }
  void broadcast(at::Tensor&, int) override { fail(); }
  at::Tensor all_gather(const at::Tensor&) override { fail(); }
  at::Tensor all_to_all(const at::Tensor&, const std::vector<int64_t>&, std::vector<int64_t>*) override { fail(); }
  void barrier() override { fail(); }
  std::unique_ptr<dist::Comm> split(int, int) override { fail(); }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }

 private:
  [[noreturn]] static void fail() { throw std::logic_error("SizeOnlyComm cannot communicate"); }
  int n_;
};

void expect_invalid(const MoeOptions& o, const std::string& needle) {
  try {
    MoeFeedForward m(o);
    ADD_FAILURE() << "no error for " << needle;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Moe, BadOptionsAreNamed) {
  auto ok = options(1, true);
  auto o = ok;
  o.top_k = 0;
  expect_invalid(o, "top_k");
  o.top_k = 7;
  expect_invalid(o, "top_k");
  o = ok;
  o.capacity_factor = 0;
  expect_invalid(o, "capacity_factor");
  o.capacity_factor = -1;
  expect_invalid(o, "capacity_factor");
  o = ok;
  o.experts = 0;
  expect_invalid(o, "experts");
  o = ok;
  o.dim = 0;
  expect_invalid(o, "dim");
  o = ok;
  o.inner = -3;
  expect_invalid(o, "inner");
  o = ok;
  o.activation = "tanh";
  expect_invalid(o, "activation");
  o = ok;
  o.dropout = 1.0;
  expect_invalid(o, "dropout");
  o = ok;
  o.noise_eps = -1e-3;
  expect_invalid(o, "noise_eps");
  o = ok;
  o.balance_coef = -1;
  expect_invalid(o, "balance_coef");
  // E not divisible by the expert-parallel size.
  SizeOnlyComm two(2), four(4);
  o = ok;
  o.experts = 3;
  o.world = &two;
  o.ep = &two;
  expect_invalid(o, "divisible by the expert-parallel size");
  o = ok;
  o.ep = &two;
  expect_invalid(o, "world");  // EP without a world
  o.world = &two;
  o.ep = &four;
  o.experts = 8;
  expect_invalid(o, "world size");
  // A wrong input shape.
  auto m = MoeFeedForward(ok);
  EXPECT_THROW(m->forward(torch::zeros({3, 4})), std::invalid_argument);
  EXPECT_THROW(m->forward(torch::zeros({5})), std::invalid_argument);
}

// Under MPI the real world: E = 3 over 2 ranks is refused on every rank (before communicating).
TEST(Moe, ExpertsNotDivisibleByTheWorldAreRefused) {
  if (world().size() == 1) GTEST_SKIP() << "needs more than one process";
  auto o = options(1, true);
  o.experts = world().size() + 1;
  o.world = o.ep = &world();
  expect_invalid(o, "experts (" + std::to_string(o.experts) + ") must be divisible");
}

TEST(Moe, ExpertParameterKeys) {
  EXPECT_EQ(MoeFeedForwardImpl::expert_of_parameter("expert3.fc1.weight"), 3);
  EXPECT_EQ(MoeFeedForwardImpl::expert_of_parameter("expert12.fc2.bias"), 12);
  EXPECT_EQ(MoeFeedForwardImpl::expert_of_parameter("w_gate"), -1);
  EXPECT_EQ(MoeFeedForwardImpl::expert_of_parameter("expert.fc1.weight"), -1);
  EXPECT_EQ(MoeFeedForwardImpl::expert_of_parameter("expert3"), -1);
}

}  // namespace
