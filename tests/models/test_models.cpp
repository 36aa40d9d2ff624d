// The SequenceModel contract, checked for every registered variant: real outputs do not depend
// on how much padding precedes them, later items never change earlier outputs, encode_last is
// the last slot of encode, every parameter receives a gradient, initialisation follows the
// seed, and the signature names each variant's own options.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <set>

#include <string>

#include "models/model.h"
#include "ops/dropout/dropout.h"
#include "ops/kernels.h"

namespace {
using namespace seqrec::models;

struct Variant {
  std::string name;
  void (*set)(ModelOptions&);
};

std::vector<Variant> variants() {
  return {
      {"sasrec_preln", [](ModelOptions& o) { o.model = "sasrec"; }},
      {"sasrec_postln", [](ModelOptions& o) { o.model = "sasrec"; o.norm_first = false; }},
      {"lightsans", [](ModelOptions& o) { o.model = "lightsans"; o.interests = 3; }},
      {"lightsans_ape", [](ModelOptions& o) { o.model = "lightsans"; o.interests = 3; o.lightsans_position = "absolute"; }},
      {"lightsans_postln_gelu", [](ModelOptions& o) {
         o.model = "lightsans"; o.norm_first = false; o.ffn_activation = "gelu"; o.ffn_inner = 32; }},
      {"linrec_paper", [](ModelOptions& o) { o.model = "linrec"; }},
      {"lisa_base", [](ModelOptions& o) { o.model = "lisa"; o.codebooks = 3; o.codewords = 5; o.norm_first = false; }},
      {"lisa_soft", [](ModelOptions& o) {
         o.model = "lisa"; o.lisa_variant = "soft"; o.codebooks = 2; o.codewords = 4; o.lisa_commitment = 0.01; }},
      {"lisa_mini", [](ModelOptions& o) {
         o.model = "lisa"; o.lisa_variant = "mini"; o.codebooks = 2; o.codewords = 3; o.target_codebooks = 3;
         o.target_codewords = 6; o.lisa_decay = 0; }},
      {"lisa_base_ema", [](ModelOptions& o) {
         o.model = "lisa"; o.codebooks = 3; o.codewords = 5; o.codebook_update = "ema"; o.blocks = 1; }},
      {"linrec_code", [](ModelOptions& o) { o.model = "linrec"; o.linrec_norm = "code"; o.norm_first = false; }},
      {"linrec_pad_keys", [](ModelOptions& o) { o.model = "linrec"; o.linrec_pad_keys = true; }},
      {"linrec_pad_keys_code_postln", [](ModelOptions& o) {
         o.model = "linrec"; o.linrec_pad_keys = true; o.linrec_norm = "code"; o.norm_first = false; }},
      {"routing_local_and_routed", [](ModelOptions& o) {
         o.model = "routing"; o.routing_clusters = 4; o.routing_window = 5; o.routing_chunk = 6; o.local_window = 7; }},
      {"routing_all_routed_postln", [](ModelOptions& o) {
         o.model = "routing"; o.routing_heads = 2; o.routing_clusters = 3; o.norm_first = false; }},
      // Every expert sees every token (top_k = E, ample capacity) so each gets a gradient.
      {"flash4rec_softmax_moe", [](ModelOptions& o) {
         o.model = "flash4rec"; o.flash_user = "zero"; o.moe_experts = 2; o.moe_top_k = 2; o.capacity_factor = 2;
         o.topk_dropout_k = 3; }},
      {"flash4rec_cosine_item_gate_postln", [](ModelOptions& o) {
         o.model = "flash4rec"; o.flash_attention = "cosine"; o.flash_user = "none"; o.moe_experts = 0;
         o.norm_first = false; o.flash_qk_dim = 6; }},
      {"flash4rec_mhsa", [](ModelOptions& o) {
         o.model = "flash4rec"; o.flash_unit = "mhsa"; o.flash_user = "none"; o.moe_experts = 0; }},
  };
}

ModelOptions options(const Variant& v) {
  ModelOptions o;
  o.num_items = 30;
  o.max_len = 80;
  o.hidden = 8;
  o.blocks = 2;
  o.heads = 2;
  o.dropout = 0.0;
  o.init_seed = 5;
  v.set(o);
  return o;
}

// validate(o) must refuse `o` with std::invalid_argument naming `what`; `accepted` says what
// was wrongly accepted otherwise.
void expect_invalid(const ModelOptions& o, const std::string& what, const std::string& accepted) {
  try {
    validate(o);
    ADD_FAILURE() << accepted;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

at::Tensor seq(const std::vector<int64_t>& items, int64_t L) {
  auto t = torch::zeros({1, L}, torch::kInt64);
  for (size_t i = 0; i < items.size(); ++i) t[0][L - items.size() + i] = items[i];
  return t;
}

// A sequence long enough to span several of the ops' chunks (32/64 slots).
std::vector<int64_t> long_items(int64_t n, int64_t salt) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(1 + (i * 7 + salt * 3) % 30);
  return v;
}

class ModelContract : public ::testing::TestWithParam<Variant> {};

TEST_P(ModelContract, PaddingLengthDoesNotChangeRealOutputs) {
  auto m = make_model(options(GetParam()));
  m->set_training(false);
  torch::NoGradGuard g;
  auto items = long_items(70, 1);
  auto a = m->encode(seq(items, 70));
  auto b = m->encode(seq(items, 80));
  EXPECT_TRUE(torch::allclose(a, b.narrow(1, 10, 70), 1e-5, 1e-5)) << (a - b.narrow(1, 10, 70)).abs().max();
  EXPECT_EQ(b.narrow(1, 0, 10).abs().sum().item<double>(), 0.0) << "padded slots must be zero";
  EXPECT_TRUE(torch::isfinite(b).all().item<bool>());
}

TEST_P(ModelContract, FutureItemsDoNotChangeEarlierOutputs) {
  auto m = make_model(options(GetParam()));
  m->set_training(false);
  torch::NoGradGuard g;
  auto items = long_items(75, 2);
  auto a = m->encode(seq(items, 80));
  items[70] = items[70] % 30 + 1;
  items[74] = items[74] % 30 + 1;
  auto b = m->encode(seq(items, 80));
  // slot of items[70] is 5 + 70 = 75
  EXPECT_TRUE(torch::equal(a.narrow(1, 0, 75), b.narrow(1, 0, 75)));
  EXPECT_FALSE(torch::allclose(a.narrow(1, 75, 5), b.narrow(1, 75, 5)));
}

TEST_P(ModelContract, EncodeLastEqualsTheLastSlotOfEncode) {
  auto m = make_model(options(GetParam()));
  m->set_training(false);
  torch::NoGradGuard g;
  auto input = torch::cat({seq({3, 7, 1, 9}, 70), seq({5}, 70), seq(long_items(70, 3), 70)});
  auto full = m->encode(input).select(1, 69);
  auto last = m->encode_last(input);
  EXPECT_TRUE(torch::allclose(full, last, 1e-5, 1e-5)) << (full - last).abs().max();
}

// The last-slot objective trains through encode_last: in training mode it must give encode's
// last slot and the same parameter gradients (without dropout), and draw the same dropout calls
// from the generator as encode (a last-slot path that skipped a dropout would train another
// model; SASRec's attention probabilities once did).
TEST_P(ModelContract, EncodeLastTrainsAsTheLastSlotOfEncode) {
  auto o = options(GetParam());
  const auto input = torch::cat({seq({3, 7, 1, 9}, 70), seq({5}, 70), seq(long_items(70, 3), 70)});
  const auto weights = torch::linspace(-1, 1, 3 * o.hidden).view({3, o.hidden});
  auto grads = [&](SequenceModel& m, bool last) {
    torch::manual_seed(3);  // the same gating noise (FLASH4Rec's mixture of experts) both times
    for (auto& [name, p] : m.named_parameters()) p.mutable_grad() = at::Tensor();
    auto h = last ? m.encode_last(input) : m.encode(input).select(1, 69);
    (h * weights).sum().backward();
    std::vector<at::Tensor> g;
    for (auto& [name, p] : m.named_parameters())
      g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    return std::make_pair(h.detach(), g);
  };
  auto m = make_model(o);
  m->set_training(true);
  auto [full_h, full_g] = grads(*m, false);
  m->take_auxiliary_loss();
  auto [last_h, last_g] = grads(*m, true);
  m->take_auxiliary_loss();
  EXPECT_TRUE(torch::allclose(full_h, last_h, 1e-5, 1e-5)) << (full_h - last_h).abs().max();
  auto names = m->named_parameters();
  for (size_t i = 0; i < full_g.size(); ++i)
    EXPECT_TRUE(torch::allclose(full_g[i], last_g[i], 1e-4, 1e-5))
        << names[i].first << ": " << (full_g[i] - last_g[i]).abs().max();

  o.dropout = 0.2;
  auto d = make_model(o);
  d->set_training(true);
  auto draws_after = [&](bool last) {
    torch::manual_seed(11);
    torch::NoGradGuard g;
    last ? d->encode_last(input) : d->encode(input);
    d->take_auxiliary_loss();
    return seqrec::ops::random_seed();
  };
  EXPECT_EQ(draws_after(false), draws_after(true)) << "encode_last drew a different number of dropout calls";
}

// --matmul_precision medium for a scope.
struct Medium {
  Medium() { seqrec::ops::set_matmul_precision("medium"); }
  ~Medium() { seqrec::ops::set_matmul_precision("highest"); }
};

// Whether t's autograd graph holds a node whose name contains `name`, and how many.
int64_t graph_count(const at::Tensor& t, const std::string& name) {
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo{t.grad_fn().get()};
  int64_t count = 0;
  while (!todo.empty()) {
    auto* n = todo.back();
    todo.pop_back();
    if (!n || !seen.insert(n).second) continue;
    if (n->name().find(name) != std::string::npos) ++count;
    for (const auto& e : n->next_edges()) todo.push_back(e.function.get());
  }
  return count;
}
bool graph_has(const at::Tensor& t, const std::string& name) { return graph_count(t, name) > 0; }

// The trainer's length slices in one call: encode_slices must give each slice's encode()
// (flattened) or encode_last(), laid end to end, with the same parameter gradients, whether the
// model joins the slices (the backbone's embeddings and position-wise layers once over every
// slot) or runs them one by one.
TEST_P(ModelContract, EncodeSlicesEqualsEachSliceAlone) {
  auto o = options(GetParam());
  o.topk_dropout = 0;  // joined, the slices draw their random masks in another order
  const std::vector<at::Tensor> inputs{torch::cat({seq(long_items(70, 3), 70), seq(long_items(66, 5), 70)}),
                                       torch::cat({seq({3, 7, 1, 9}, 9), seq({5, 2, 8, 4, 4, 6, 1, 2, 3}, 9),
                                                   seq({5}, 9)}),
                                       seq({4, 2}, 2)};
  auto m = make_model(o);
  m->set_training(true);
  // At medium, SASRec and LinRec join their bfloat16 products (LinRec's attention reads them).
  for (const bool medium : {false, true})
  for (const bool last_only : {false, true}) {
    std::optional<Medium> precision;
    if (medium) precision.emplace();
    auto run = [&](bool joined) {
      torch::manual_seed(3);  // the same gating noise (FLASH4Rec's mixture of experts) both times
      for (auto& [name, p] : m->named_parameters()) p.mutable_grad() = at::Tensor();
      at::Tensor h;
      if (joined) {
        h = m->encode_slices(inputs, {}, last_only);
      } else {
        std::vector<at::Tensor> parts;
        for (auto& in : inputs) parts.push_back(last_only ? m->encode_last(in) : m->encode(in).reshape({-1, o.hidden}));
        h = torch::cat(parts);
      }
      m->take_auxiliary_loss();
      const int64_t embeddings = graph_count(h, "EmbeddingBackward");
      (h * torch::linspace(-1, 1, h.numel()).view(h.sizes())).sum().backward();
      std::vector<at::Tensor> g;
      for (auto& [name, p] : m->named_parameters())
        g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
      return std::make_tuple(h.detach(), g, embeddings);
    };
    const auto [alone_h, alone_g, alone_embeddings] = run(false);
    const auto [joined_h, joined_g, joined_embeddings] = run(true);
    const std::string where = std::string(medium ? "medium" : "highest") + (last_only ? ", last only" : ", every slot");
    ASSERT_EQ(joined_h.sizes(), alone_h.sizes()) << where;
    EXPECT_TRUE(torch::allclose(joined_h, alone_h, medium ? 1e-3 : 1e-5, medium ? 1e-3 : 1e-5)) << where << ": " << (joined_h - alone_h).abs().max();
    // At medium a weight's gradient is a bfloat16 product, rounded once joined and once per
    // slice alone (then summed): they agree to bfloat16's rounding.
    auto names = m->named_parameters();
    for (size_t i = 0; i < alone_g.size(); ++i) {
      if (medium) {
        // (A few gradients are zero but for rounding, LightSANs' key-position bias's: a floor.)
        const double scale = std::max(alone_g[i].norm().item<double>(), 1e-2);
        EXPECT_LT((joined_g[i] - alone_g[i]).norm().item<double>(), 2e-2 * scale) << where << ", " << names[i].first;
      } else {
        EXPECT_TRUE(torch::allclose(joined_g[i], alone_g[i], 1e-4, 1e-5))
            << where << ", " << names[i].first << ": " << (joined_g[i] - alone_g[i]).abs().max();
      }
    }
    // SASRec and LinRec join the slices: one lookup of the item table and one of the position
    // table for all three, where slice by slice there is a pair per slice.
    const auto& name = GetParam().name;
    if (name.rfind("sasrec", 0) == 0 || name.rfind("linrec", 0) == 0) {
      EXPECT_EQ(alone_embeddings, 6);
      EXPECT_EQ(joined_embeddings, 2) << "the slices were not joined";
    }
  }
}

TEST_P(ModelContract, EveryParameterGetsAGradient) {
  auto o = options(GetParam());
  o.dropout = 0.1;
  auto m = make_model(o);
  m->set_training(true);
  auto input = torch::cat({seq(long_items(40, 4), 40), seq({2, 4, 6}, 40)});
  auto h = m->encode(input);
  auto loss = torch::matmul(h, m->item_embeddings().t()).logsumexp(-1).sum();
  loss.backward();
  for (auto& [name, p] : m->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_TRUE(torch::isfinite(p.grad()).all().item<bool>()) << name;
    if (name.find("item_emb") == std::string::npos) {
      EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0) << name;
    }
  }
}

// --matmul_precision medium reaches every variant's layers: its outputs move by bfloat16's
// rounding and no more, and every parameter still gets a finite float32 gradient.

TEST_P(ModelContract, MediumPrecisionRoundsTheProductsAndStillTrains) {
  auto m = make_model(options(GetParam()));
  const auto input = torch::cat({seq(long_items(40, 4), 40), seq({2, 4, 6}, 40)});
  auto encode = [&] {
    torch::manual_seed(3);  // the same gating noise (FLASH4Rec's mixture of experts) both times
    m->set_training(false);
    torch::NoGradGuard g;
    return m->encode(input);
  };
  const auto full = encode();
  const Medium medium;
  const auto half = encode();
  const double rel = (half - full).norm().item<double>() / full.norm().item<double>();
  EXPECT_GT(rel, 1e-6) << "no product of the model ran on bfloat16 operands";
  EXPECT_LT(rel, 2e-2);
  m->set_training(true);
  auto h = m->encode(input);
  m->take_auxiliary_loss();
  // The one-pass bfloat16 epilogues are in the graph: every backbone feed-forward layer's, and
  // SASRec's attention probabilities'.
  bool feed_forward = false;
  for (auto& [name, p] : m->named_parameters()) feed_forward |= name.find("ffn.fc1") != std::string::npos;
  EXPECT_EQ(graph_has(h, "BiasActivationDropoutFused"), feed_forward);
  if (GetParam().name.rfind("sasrec", 0) == 0) {
    EXPECT_TRUE(graph_has(h, "SoftmaxDropoutBf16Fused"));
  }
  torch::matmul(h, m->item_embeddings().t()).logsumexp(-1).sum().backward();
  for (auto& [name, p] : m->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().scalar_type(), torch::kFloat) << name;
    EXPECT_TRUE(torch::isfinite(p.grad()).all().item<bool>()) << name;
  }
}

TEST_P(ModelContract, InitialisationFollowsTheSeed) {
  auto o = options(GetParam());
  auto a = make_model(o), b = make_model(o);
  o.init_seed = 6;
  auto c = make_model(o);
  auto pa = a->named_parameters(), pb = b->named_parameters(), pc = c->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  bool any_diff = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second)) << pa[i].first;
    any_diff |= !torch::equal(pa[i].second, pc[i].second);
  }
  EXPECT_TRUE(any_diff);
  for (auto& [name, t] : pa) {
    if (name == "item_emb.weight") {
      EXPECT_EQ(t[0].abs().sum().item<double>(), 0.0) << "padding row starts at zero";
    }
  }
}

TEST_P(ModelContract, SignatureRoundTrips) {
  auto o = options(GetParam());
  EXPECT_EQ(model_signature(parse_model_signature(model_signature(o))), model_signature(o));
  EXPECT_TRUE(signature_difference(model_signature(o), model_signature(o)).empty());
}

// The GPU tier (skipped where no CUDA device is visible): a model moved to the device computes
// what its CPU twin computes, in evaluation and through two training steps (gradients, the
// MoE's noisy gating and Top-K attention dropout, whose bits are drawn on the host, and the
// EMA statistics). Tolerance: 1e-4 absolute + 1e-3 relative, float32 reduction order apart.
TEST_P(ModelContract, RunsOnCudaAsOnCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible: this check runs on a GPU machine";
  const at::Device cuda(at::kCUDA, 0);
  auto o = options(GetParam());
  o.num_users = 3;
  auto cpu = make_model(o), gpu = make_model(o);
  gpu->to(cuda);
  for (auto& named : {gpu->named_parameters(), gpu->named_buffers()})
    for (auto& [name, t] : named) ASSERT_TRUE(t.device() == cuda) << name << " stayed on " << t.device();
  EXPECT_TRUE(gpu->device() == cuda);
  auto input = torch::cat({seq(long_items(40, 4), 40), seq({2, 4, 6}, 40), seq({9}, 40)});
  UserInput users;
  users.ids = torch::arange(3, torch::kInt64);
  UserInput users_gpu;
  users_gpu.ids = users.ids.to(cuda);
  const auto close = [](const at::Tensor& a, const at::Tensor& b) {
    return torch::allclose(a, b.to(torch::kCPU), 1e-3, 1e-4);
  };
  {
    cpu->set_training(false);
    gpu->set_training(false);
    torch::NoGradGuard g;
    auto a = cpu->encode(input, users), b = gpu->encode(input.to(cuda), users_gpu);
    EXPECT_TRUE(b.device() == cuda);
    EXPECT_TRUE(close(a, b)) << (a - b.cpu()).abs().max();
    auto la = cpu->encode_last(input, users), lb = gpu->encode_last(input.to(cuda), users_gpu);
    EXPECT_TRUE(close(la, lb)) << (la - lb.cpu()).abs().max();
  }
  cpu->set_training(true);
  gpu->set_training(true);
  for (int step = 0; step < 2; ++step) {
    at::Tensor losses[2];
    for (int i = 0; i < 2; ++i) {
      auto& m = i == 0 ? cpu : gpu;
      torch::manual_seed(11 + step);  // the same host draws (MoE noise, Top-K dropout) for both
      auto h = m->encode(i == 0 ? input : input.to(cuda), i == 0 ? users : users_gpu);
      auto loss = torch::matmul(h, m->item_embeddings().t()).logsumexp(-1).sum();
      if (auto aux = m->take_auxiliary_loss(); aux.defined()) loss = loss + aux;
      loss.backward();
      losses[i] = loss.detach();
    }
    ASSERT_TRUE(close(losses[0], losses[1])) << "step " << step << ": " << losses[0] << " vs " << losses[1];
    auto pc = cpu->named_parameters(), pg = gpu->named_parameters();
    ASSERT_EQ(pc.size(), pg.size());
    torch::NoGradGuard g;
    for (size_t i = 0; i < pc.size(); ++i) {
      ASSERT_TRUE(pg[i].second.grad().defined() == pc[i].second.grad().defined()) << pc[i].first;
      if (!pc[i].second.grad().defined()) continue;
      EXPECT_TRUE(close(pc[i].second.grad(), pg[i].second.grad()))
          << "step " << step << " grad of " << pc[i].first << ": " << (pc[i].second.grad() - pg[i].second.grad().cpu()).abs().max();
      // One plain SGD step on both keeps them comparable for the next step.
      pc[i].second.sub_(pc[i].second.grad() * 0.01);
      pg[i].second.sub_(pg[i].second.grad() * 0.01);
      pc[i].second.mutable_grad().zero_();
      pg[i].second.mutable_grad().zero_();
    }
    auto sc = cpu->pending_statistics(), sg = gpu->pending_statistics();
    ASSERT_EQ(sc.size(), sg.size());
    for (size_t i = 0; i < sc.size(); ++i) {
      EXPECT_TRUE(sg[i].device() == cuda) << "pending statistic " << i;
      EXPECT_TRUE(close(sc[i], sg[i])) << "pending statistic " << i;
    }
    cpu->apply_statistics();
    gpu->apply_statistics();
    auto bc = cpu->named_buffers(), bg = gpu->named_buffers();
    for (size_t i = 0; i < bc.size(); ++i)
      EXPECT_TRUE(close(bc[i].second, bg[i].second)) << "step " << step << " buffer " << bc[i].first;
  }
}

INSTANTIATE_TEST_SUITE_P(AllModels, ModelContract, ::testing::ValuesIn(variants()),
                         [](const auto& info) { return info.param.name; });

TEST(Models, VariantOptionsAreValidatedAndSigned) {
  ModelOptions o;
  o.num_items = 10;
  o.model = "lightsans";
  o.interests = 0;
  EXPECT_THROW(make_model(o), std::invalid_argument);
  o.interests = 4;
  o.lightsans_position = "relative";
  EXPECT_THROW(make_model(o), std::invalid_argument);
  o = ModelOptions{};
  o.num_items = 10;
  o.model = "linrec";
  o.linrec_norm = "l1";
  EXPECT_THROW(make_model(o), std::invalid_argument);
  o.linrec_norm = "paper";
  o.ffn_activation = "tanh";
  EXPECT_THROW(make_model(o), std::invalid_argument);

  ModelOptions l;
  l.num_items = 10;
  l.model = "lightsans";
  auto ape = l;
  ape.lightsans_position = "absolute";
  EXPECT_NE(signature_difference(model_signature(l), model_signature(ape)).find("lightsans_position"),
            std::string::npos);
  // SASRec signatures written before the FFN keys existed still compare equal.
  ModelOptions s;
  s.num_items = 10;
  std::string old = model_signature(s);
  old.erase(old.find("ffn_inner="));
  EXPECT_TRUE(signature_difference(old, model_signature(s)).empty());
}

// The setup line's own options: the run's model's keys alone, where they apply.
TEST(Models, OwnOptionsNameTheModelsKeysOnly) {
  ModelOptions o;
  o.num_items = 10;
  EXPECT_EQ(own_options_text(o), "");  // SASRec reads only shared options
  o.model = "linrec";
  EXPECT_EQ(own_options_text(o), "linrec_norm=paper");  // the pad keys only where on
  o.linrec_pad_keys = true;
  EXPECT_EQ(own_options_text(o), "linrec_norm=paper linrec_pad_keys=true");
  o.model = "lightsans";
  o.interests = 7;
  EXPECT_EQ(own_options_text(o), "interests=7 lightsans_position=decoupled");
  o.model = "lisa";
  const auto lisa = own_options_text(o);
  EXPECT_NE(lisa.find("lisa_variant=base"), std::string::npos) << lisa;
  EXPECT_NE(lisa.find("lisa_temperature=0.7 "), std::string::npos) << lisa;  // not 0.69999999999999996
  EXPECT_EQ(lisa.find("ema_decay"), std::string::npos) << lisa;  // only under --codebook_update ema
  EXPECT_EQ(lisa.find("interests"), std::string::npos) << lisa;
  EXPECT_EQ(own_options_text(o).find("num_users"), std::string::npos);
  o.model = "flash4rec";
  EXPECT_EQ(own_options_text(o).find("num_users"), std::string::npos);  // set from the data, not a flag
}

ModelOptions sasrec_small() {
  ModelOptions o;
  o.num_items = 30;
  o.max_len = 12;
  o.hidden = 8;
  o.heads = 2;
  return o;
}

TEST(Models, ValidatesOptions) {
  auto o = sasrec_small();
  o.model = "nosuch";
  EXPECT_THROW(make_model(o), std::invalid_argument);
  o = sasrec_small();
  o.max_len = 0;
  EXPECT_THROW(make_model(o), std::invalid_argument);
  o = sasrec_small();
  o.heads = 3;
  EXPECT_THROW(make_model(o), std::invalid_argument);
  o = sasrec_small();
  o.dropout = 1.0;
  EXPECT_THROW(make_model(o), std::invalid_argument);
}

TEST(Models, SignatureRoundTripsAndNamesDifferences) {
  auto o = sasrec_small();
  EXPECT_EQ(model_signature(parse_model_signature(model_signature(o))), model_signature(o));
  auto p = o;
  p.hidden = 16;
  auto diff = signature_difference(model_signature(o), model_signature(p));
  EXPECT_NE(diff.find("hidden: 8 vs 16"), std::string::npos) << diff;
  EXPECT_TRUE(signature_difference(model_signature(o), model_signature(o)).empty());
}

// The cloze objective: one extra [mask] row that is never scored, and bidirectional attention
// (a later item changes an earlier slot's output, unlike the causal objective).
TEST(ClozeObjective, SasrecAttendsBothWaysAndNeverScoresTheMask) {
  auto o = sasrec_small();
  o.dropout = 0;
  o.objective = "cloze";
  auto m = make_model(o);
  m->set_training(false);
  torch::NoGradGuard g;
  EXPECT_EQ(m->item_embeddings().size(0), 31);
  auto a = seq({3, 5, 7, mask_item(o)}, 12), b = seq({3, 5, 9, mask_item(o)}, 12);
  auto ha = m->encode(a), hb = m->encode(b);
  EXPECT_FALSE(torch::allclose(ha.select(1, 9), hb.select(1, 9))) << "slot 1 must see slot 2 under cloze";
  EXPECT_TRUE(torch::allclose(m->encode_last(a), ha.select(1, 11), 1e-5, 1e-6));
  EXPECT_EQ(ha.narrow(1, 0, 8).abs().sum().item<double>(), 0.0);
  o.model = "lightsans";
  EXPECT_THROW(validate(o), std::invalid_argument);
}

// The last-slot objective: bidirectional attention within an example and no [mask] row. LinRec
// then runs its global form in every block (a later item changes an earlier slot's output), and
// its last slot is the same whether computed with the rest or alone; models that attend only
// causally are refused it by name.
TEST(LastObjective, LinrecAttendsBothWaysAndScoresTheLastSlot) {
  auto o = sasrec_small();
  o.model = "linrec";
  o.dropout = 0;
  auto causal = make_model(o);
  o.objective = "last";
  auto m = make_model(o);
  causal->set_training(false);
  m->set_training(false);
  torch::NoGradGuard g;
  EXPECT_EQ(m->item_embeddings().size(0), 31) << "no [mask] row";
  auto a = seq({3, 5, 7, 4}, 12), b = seq({3, 5, 9, 4}, 12);
  auto ha = m->encode(a), hb = m->encode(b);
  EXPECT_FALSE(torch::allclose(ha.select(1, 9), hb.select(1, 9))) << "slot 1 must see slot 2";
  EXPECT_TRUE(torch::allclose(m->encode_last(a), ha.select(1, 11), 1e-5, 1e-6));
  EXPECT_EQ(ha.narrow(1, 0, 8).abs().sum().item<double>(), 0.0) << "padded slots stay zero";
  auto ca = causal->encode(a), cb = causal->encode(b);
  EXPECT_TRUE(torch::equal(ca.select(1, 9), cb.select(1, 9))) << "the causal objective's slot 1 must not";
  o.flash_user = "zero";
  for (const char* objective : {"last", "cloze"}) {
    o.objective = objective;
    for (const char* model : {"sasrec", "flash4rec", "linrec"}) {
      o.model = model;
      EXPECT_NO_THROW(validate(o)) << model << " " << objective;
    }
    for (const char* model : {"lisa", "lightsans", "routing"}) {
      o.model = model;
      expect_invalid(o, "needs bidirectional attention", std::string(model) + " accepted objective " + objective);
    }
  }
}

// At --matmul_precision medium LinRec's global form stays in bfloat16 between its projections'
// products: the attention kernel takes the bfloat16 products and their biases and returns
// bfloat16, in every block of encode and in encode_last's last block (its one-query entry);
// encode_last still gives encode's last slot (to bfloat16 rounding: its query's product is a
// separate one), and every parameter gets a finite float32 gradient.
TEST(LastObjective, LinrecAtMediumPrecisionAttendsOnTheBfloat16Products) {
  auto o = sasrec_small();
  o.model = "linrec";
  o.objective = "last";
  o.dropout = 0;
  auto m = make_model(o);
  const Medium medium;
  m->set_training(true);
  auto a = torch::cat({seq({3, 5, 7, 4}, 12), seq({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 12)});
  auto h = m->encode(a);
  auto last = m->encode_last(a);
  EXPECT_TRUE(graph_has(h, "LinrecGlobalPaperPackedBf16"));
  EXPECT_TRUE(graph_has(last, "LinrecGlobalPaperPackedBf16")) << "the first block's attention";
  EXPECT_TRUE(graph_has(last, "LinrecGlobalPaperLastBf16")) << "the last block's";
  const double rel = ((last - h.select(1, 11)).norm() / h.select(1, 11).norm()).item<double>();
  EXPECT_LT(rel, 2e-2);
  (h.pow(2).sum() + last.pow(2).sum()).backward();
  for (auto& [name, p] : m->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().scalar_type(), torch::kFloat) << name;
    EXPECT_TRUE(torch::isfinite(p.grad()).all().item<bool>()) << name;
    EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0) << name;
  }
}

// --linrec_pad_keys: a row of n items has max_len - n padded slots among its keys and values
// whatever width its batch was trimmed to, as if every row were padded to max_len with nothing
// masked. A row without padding is untouched; a padded row's outputs change, in the causal form
// and in the global one, under pre-LN (a padded slot reads the LayerNorm's bias) and post-LN
// (it reads zeros).
TEST(Linrec, PadKeysCountEveryPaddedSlotUpToMaxLen) {
  for (bool pre_ln : {true, false}) {
    for (const char* objective : {"causal", "last"}) {
      SCOPED_TRACE(std::string(pre_ln ? "pre-LN " : "post-LN ") + objective);
      auto o = sasrec_small();
      o.model = "linrec";
      o.dropout = 0;
      o.norm_first = pre_ln;
      o.objective = objective;
      o.init_seed = 3;
      auto masked = make_model(o);
      o.linrec_pad_keys = true;
      auto m = make_model(o);
      {
        // Biases away from their zero initialisation: pre-LN's padded slots then read the
        // LayerNorm's bias, and under post-LN the projection's bias alone makes their keys and
        // values nonzero.
        torch::NoGradGuard g;
        for (auto* net : {masked.get(), m.get()})
          for (auto& [name, p] : net->named_parameters())
            if (name.find("bias") != std::string::npos) p.copy_(torch::linspace(-0.5, 0.5, p.numel()));
      }
      m->set_training(false);
      masked->set_training(false);
      torch::NoGradGuard g;
      auto whole = seq(long_items(12, 4), 12);
      EXPECT_TRUE(torch::allclose(m->encode(whole), masked->encode(whole), 1e-6, 1e-6)) << "no padding, no change";
      const std::vector<int64_t> items{3, 5, 7, 4};
      auto padded = m->encode(seq(items, 12));
      for (int64_t width : {4, 6}) {
        auto trimmed = m->encode(seq(items, width));
        EXPECT_TRUE(torch::allclose(trimmed.narrow(1, width - 4, 4), padded.narrow(1, 8, 4), 1e-5, 1e-6))
            << "width " << width << ": " << (trimmed.narrow(1, width - 4, 4) - padded.narrow(1, 8, 4)).abs().max();
        EXPECT_TRUE(torch::allclose(m->encode_last(seq(items, width)), padded.select(1, 11), 1e-5, 1e-6))
            << "width " << width;
      }
      auto without = masked->encode(seq(items, 12));
      EXPECT_FALSE(torch::allclose(padded.narrow(1, 8, 4), without.narrow(1, 8, 4), 1e-4, 1e-4))
          << "the padded slots must count as keys";
      EXPECT_EQ(padded.narrow(1, 0, 8).abs().sum().item<double>(), 0.0) << "padded slots' outputs stay zero";
    }
  }
}

// --attention_mask causal under the last objective (how RecBole trains SASRec): every model is
// then the causal model itself, slot for slot, and its last slot is what encode_last gives;
// a later item changes no earlier slot. The cloze objective refuses it, and an unknown value
// is named.
TEST(LastObjective, CausalMaskKeepsEveryModelCausal) {
  const auto a = seq(long_items(50, 1), 80);
  auto b = a.clone();
  for (int64_t t = 60; t < 80; ++t) b[0][t] = 1 + (b[0][t].item<int64_t>() % 30);  // the last 20 items changed
  for (const auto& v : variants()) {
    SCOPED_TRACE(v.name);
    auto o = options(v);
    auto causal = make_model(o);
    o.objective = "last";
    o.attention_mask = "causal";
    ASSERT_NO_THROW(validate(o));
    auto m = make_model(o);
    causal->set_training(false);
    m->set_training(false);
    torch::NoGradGuard g;
    auto ha = m->encode(a), hb = m->encode(b);
    EXPECT_TRUE(torch::allclose(ha, causal->encode(a), 1e-5, 1e-6)) << "the causal model, slot for slot";
    EXPECT_TRUE(torch::allclose(ha.narrow(1, 0, 60), hb.narrow(1, 0, 60))) << "a later item reached an earlier slot";
    EXPECT_FALSE(torch::allclose(ha.select(1, 79), hb.select(1, 79)));
    EXPECT_TRUE(torch::allclose(m->encode_last(a), ha.select(1, 79), 1e-5, 1e-6));
  }
  auto o = sasrec_small();
  o.objective = "cloze";
  o.attention_mask = "causal";
  expect_invalid(o, "contradicts objective cloze", "cloze accepted a causal mask");
  o.objective = "last";
  o.attention_mask = "none";
  expect_invalid(o, "unknown attention_mask 'none'", "an unknown attention_mask was accepted");
  o.attention_mask = "auto";
  o.model = "lisa";
  expect_invalid(o, "--attention_mask causal", "lisa accepted the last objective with bidirectional attention");
  // The signature carries the mask under the last objective only (older signatures: auto).
  o.model = "sasrec";
  auto c = o;
  c.attention_mask = "causal";
  EXPECT_NE(signature_difference(model_signature(o), model_signature(c)).find("attention_mask"), std::string::npos);
  o.objective = c.objective = "causal";
  EXPECT_TRUE(signature_difference(model_signature(o), model_signature(c)).empty());
}

// FLASH4Rec's user-aware gate: the rows' user features change the output (and the item-only gate
// ignores them); a batch without the features the model was built for is refused by name.
// A small FLASH4Rec whose gate reads two user features (cardinalities 2 and 3), without dropout.
ModelOptions flash4rec_with_features(int64_t experts) {
  ModelOptions o;
  o.model = "flash4rec";
  o.num_items = 30;
  o.max_len = 12;
  o.hidden = 8;
  o.dropout = 0;
  o.moe_experts = experts;
  o.user_feature_cardinalities = {2, 3};
  return o;
}

TEST(Flash4rec, UserFeaturesReachTheGate) {
  auto o = flash4rec_with_features(2);
  auto m = make_model(o);
  m->set_training(false);
  torch::NoGradGuard g;
  auto input = torch::cat({seq({3, 5, 7}, 12), seq({4, 6}, 12)});
  UserInput a{torch::tensor({0, 1}), torch::tensor({{1, 2}, {2, 3}})};
  UserInput b{torch::tensor({0, 1}), torch::tensor({{2, 2}, {2, 3}})};
  auto ha = m->encode(input, a), hb = m->encode(input, b);
  EXPECT_FALSE(torch::allclose(ha[0], hb[0])) << "user 0's features changed";
  EXPECT_TRUE(torch::allclose(ha[1], hb[1])) << "user 1's features did not";
  EXPECT_THROW(m->encode(input), c10::Error);
  o.flash_user = "none";
  auto item_only = make_model(o);
  item_only->set_training(false);
  EXPECT_TRUE(torch::equal(item_only->encode(input, a), item_only->encode(input, b)));
  o.flash_user = "features";
  o.user_feature_cardinalities = {};
  expect_invalid(o, "the dataset has no user features", "features on a dataset without them");
}

// Joined slices carry each slice's users to the gate: a dense FLASH4Rec (no mixture of experts,
// so its slices join) gives each slice's own encode() with that slice's users.
TEST(Flash4rec, JoinedSlicesCarryEachSlicesUsers) {
  auto o = flash4rec_with_features(0);
  o.topk_dropout = 0;
  auto m = make_model(o);
  m->set_training(false);
  torch::NoGradGuard g;
  const std::vector<at::Tensor> inputs{torch::cat({seq({3, 5, 7}, 3), seq({4, 6, 2}, 3)}), seq({4, 6}, 2)};
  std::vector<UserInput> users{{torch::tensor({0, 1}), torch::tensor({{1, 2}, {2, 3}})},
                               {torch::tensor({2}), torch::tensor({{2, 1}})}};
  for (const bool last_only : {false, true}) {
    auto alone = [&](size_t s) {
      return last_only ? m->encode_last(inputs[s], users[s]) : m->encode(inputs[s], users[s]).reshape({-1, o.hidden});
    };
    const auto joined = m->encode_slices(inputs, users, last_only);
    const auto expected = torch::cat({alone(0), alone(1)});
    EXPECT_TRUE(torch::allclose(joined, expected, 1e-5, 1e-5)) << (joined - expected).abs().max();
    const int64_t first = last_only ? 2 : 6;  // the first slice's encoded slots
    auto changed_users = users;
    changed_users[1].features = torch::tensor({{1, 1}});
    const auto changed = m->encode_slices(inputs, changed_users, last_only);
    EXPECT_TRUE(torch::equal(changed.narrow(0, 0, first), joined.narrow(0, 0, first)));
    EXPECT_FALSE(torch::allclose(changed.narrow(0, first, changed.size(0) - first),
                                 joined.narrow(0, first, joined.size(0) - first)))
        << "the second slice's user features did not reach its gate";
  }
  EXPECT_THROW(m->encode_slices(inputs, {users[0]}, false), c10::Error);
}

}  // namespace
