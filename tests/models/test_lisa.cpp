// LISA-specific behaviour beyond the model contract (test_models.cpp): the compression ratio is
// the paper's Table 2 formula, EMA codebook statistics are additive (two half batches summed =
// one whole batch, the property the all-reduce relies on), the EMA state is a checkpointed
// buffer, the inputs-optimize term, Base's codes shared between targets and inputs, and variant
// options that must be named in errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/model.h"
#include "ops/profile_scope.h"
#include "train/profiler.h"

namespace {
using namespace seqrec::models;

ModelOptions lisa(const std::string& variant) {
  ModelOptions o;
  o.model = "lisa";
  o.lisa_variant = variant;
  o.num_items = 40;
  o.max_len = 16;
  o.hidden = 8;
  o.blocks = 1;
  o.heads = 1;
  o.dropout = 0.0;
  o.codebooks = 3;
  o.codewords = 6;
  o.norm_first = false;
  o.init_seed = 9;
  return o;
}

at::Tensor batch(int64_t rows, int64_t L, int64_t salt) {
  auto t = torch::zeros({rows, L}, torch::kInt64);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = r % 5; i < L; ++i) t[r][i] = 1 + (r * 13 + i * 7 + salt) % 40;
  return t;
}

TEST(Lisa, CompressionRatioIsThePapersFormula) {
  // ML-1M (3,416 items), D = 128: Base B = 8, W = 128 -> 3.19x; Mini adds B = 8, W = 32 -> 2.51x.
  ModelOptions o;
  o.model = "lisa";
  o.num_items = 3416;
  o.hidden = 128;
  o.codebooks = 8;
  o.codewords = 128;
  EXPECT_NEAR(compression_ratio(o), 3.19, 0.005);
  o.lisa_variant = "mini";
  o.codewords = 32;
  o.target_codebooks = 8;
  o.target_codewords = 128;
  EXPECT_NEAR(compression_ratio(o), 2.51, 0.005);
  o.lisa_variant = "soft";
  EXPECT_EQ(compression_ratio(o), 0.0);
  o.model = "sasrec";
  EXPECT_EQ(compression_ratio(o), 0.0);
}

std::vector<at::Tensor> snapshot(std::vector<at::Tensor> v) {
  for (auto& t : v) t = t.clone();
  return v;
}

TEST(Lisa, EmaStatisticsAreAdditiveAcrossBatchSplits) {
  for (std::string variant : {"base", "mini"}) {
    auto o = lisa(variant);
    o.codebook_update = "ema";
    o.target_codebooks = 2;
    o.target_codewords = 5;
    auto whole = make_model(o), half_a = make_model(o), half_b = make_model(o);
    for (auto* m : {whole.get(), half_a.get(), half_b.get()}) m->set_training(true);
    auto x = batch(8, 16, 1);
    whole->encode(x);
    half_a->encode(x.narrow(0, 0, 3));
    half_b->encode(x.narrow(0, 3, 5));
    auto s_whole = snapshot(whole->pending_statistics());
    auto s_a = half_a->pending_statistics(), s_b = half_b->pending_statistics();
    ASSERT_EQ(s_whole.size(), variant == "mini" ? 4u : 2u);
    double total = 0;
    for (size_t i = 0; i < s_whole.size(); ++i) {
      EXPECT_TRUE(torch::allclose(s_a[i] + s_b[i], s_whole[i], 1e-5, 1e-5)) << variant << " statistic " << i;
      total += s_whole[i].abs().sum().item<double>();
    }
    EXPECT_GT(total, 0.0);
    // Applying the summed halves on one copy equals applying the whole batch.
    for (size_t i = 0; i < s_a.size(); ++i) s_a[i].add_(s_b[i]);
    half_a->apply_statistics();
    whole->apply_statistics();
    auto ba = half_a->named_buffers(), bw = whole->named_buffers();
    ASSERT_EQ(ba.size(), bw.size());
    bool has_codebooks = false;
    for (size_t i = 0; i < ba.size(); ++i) {
      EXPECT_TRUE(torch::allclose(ba[i].second, bw[i].second, 1e-5, 1e-6)) << ba[i].first;
      has_codebooks |= ba[i].first.find("codebooks") != std::string::npos;
    }
    EXPECT_TRUE(has_codebooks) << "EMA codebooks must be buffers (checkpointed, not trained by Adam)";
    for (auto& [name, p] : whole->named_parameters())
      EXPECT_EQ(name.find(".codebooks"), std::string::npos) << name;
    // Pending sums are cleared after an update; eval forwards collect nothing.
    for (auto& t : whole->pending_statistics()) EXPECT_EQ(t.abs().sum().item<double>(), 0.0);
    whole->set_training(false);
    whole->encode(x);
    for (auto& t : whole->pending_statistics()) EXPECT_EQ(t.abs().sum().item<double>(), 0.0);
  }
}

// Items are quantized once per batch and their codes gathered into every slot holding them:
// a batch's training-mode outputs and parameter gradients must equal those of its rows run
// one at a time (rows share items here), and the EMA counts must count each real slot once
// per codebook and padding not at all.
TEST(Lisa, RowsSharingItemsAreEncodedAsIfAlone) {
  for (std::string variant : {"base", "soft", "mini"}) {
    auto o = lisa(variant);
    o.target_codebooks = 2;
    o.target_codewords = 5;
    auto m = make_model(o);
    m->set_training(true);
    auto x = batch(6, 16, 2);
    auto grads = [&](const at::Tensor& rows) {
      for (auto& [n, p] : m->named_parameters()) p.mutable_grad() = at::Tensor();
      auto h = m->encode(rows);
      (h * h.detach().sin()).sum().backward();
      std::vector<at::Tensor> g;
      for (auto& [n, p] : m->named_parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
      return std::make_pair(h.detach(), g);
    };
    auto [whole, g_whole] = grads(x);
    std::vector<at::Tensor> g_sum;
    for (int64_t r = 0; r < x.size(0); ++r) {
      auto [one, g_one] = grads(x.narrow(0, r, 1));
      EXPECT_TRUE(torch::allclose(one[0], whole[r], 1e-5, 1e-6)) << variant << " row " << r;
      if (g_sum.empty()) g_sum = g_one;
      else for (size_t i = 0; i < g_one.size(); ++i) g_sum[i] += g_one[i];
    }
    auto names = m->named_parameters();
    for (size_t i = 0; i < g_sum.size(); ++i)
      EXPECT_TRUE(torch::allclose(g_sum[i], g_whole[i], 1e-4, 1e-6)) << variant << " " << names[i].first;
  }
  auto o = lisa("base");
  o.codebook_update = "ema";
  auto m = make_model(o);
  m->set_training(true);
  auto x = batch(6, 16, 2);
  m->encode(x);
  const double real_slots = static_cast<double>(x.ne(0).sum().item<int64_t>());
  auto counts = m->pending_statistics().at(0);  // [codebooks, codewords]
  EXPECT_DOUBLE_EQ(counts.sum().item<double>(), real_slots * o.codebooks);
}

// LISA-Base (gradient codebooks) quantizes every item for the targets; a forward that asks for
// the targets first gathers its inputs' codes from them instead of quantizing the inputs again.
// Outputs, loss and every gradient equal those of the inputs-first order (which cannot share), in
// training and evaluation, with the inputs-optimize term; the saved work is real (fewer matrix
// products, counted by the profiler); and the codes are not reused after a backward has gone
// through them or after a parameter changed.
TEST(Lisa, BaseInputsReuseTheTargetsCodes) {
  auto o = lisa("base");
  o.lisa_commitment = 0.01;
  auto m = make_model(o);
  auto x = batch(6, 16, 4);
  auto pos = batch(6, 16, 5);
  auto step = [&](bool targets_first, int64_t* products) {
    for (auto& [n, p] : m->named_parameters()) p.mutable_grad() = at::Tensor();
    if (products) seqrec::train::start_profile();
    at::Tensor table, h;
    if (targets_first) {
      table = m->item_embeddings();
      h = m->encode(x);
    } else {
      h = m->encode(x);
      table = m->item_embeddings();
    }
    if (products) {
      *products = 0;
      for (const auto& r : seqrec::train::stop_profile().rows)
        if (r.name == "aten::mm") *products = r.calls;
    }
    auto mask = pos.ne(0);
    auto loss = (h.index({mask}) * table.index_select(0, pos.index({mask}))).sum(-1).sigmoid().sum();
    if (auto aux = m->take_auxiliary_loss(); aux.defined()) loss = loss + aux;
    std::vector<at::Tensor> g;
    if (at::GradMode::is_enabled()) {
      loss.backward();
      for (auto& [n, p] : m->named_parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    }
    return std::make_tuple(h.detach(), loss.detach(), g);
  };
  m->set_training(true);
  int64_t separate_mm = 0, shared_mm = 0;
  auto [h0, l0, g0] = step(false, &separate_mm);
  auto [h1, l1, g1] = step(true, &shared_mm);
  EXPECT_TRUE(torch::allclose(h1, h0, 1e-5, 1e-6)) << (h1 - h0).abs().max().item<double>();
  EXPECT_NEAR(l1.item<double>(), l0.item<double>(), 1e-5 * std::abs(l0.item<double>()));
  auto names = m->named_parameters();
  for (size_t i = 0; i < g0.size(); ++i)
    EXPECT_TRUE(torch::allclose(g1[i], g0[i], 1e-4, 1e-6)) << names[i].first;
  // Inputs quantized again: 3 products per codebook more.
  EXPECT_EQ(separate_mm - shared_mm, 3 * o.codebooks) << separate_mm << " against " << shared_mm;
  // After that backward the same parameters are still current; the codes' graph is spent, so a
  // new forward quantizes afresh (and its backward works).
  auto [h2, l2, g2] = step(true, nullptr);
  EXPECT_TRUE(torch::allclose(h2, h1, 1e-6, 1e-7));
  // A parameter that changes in place (as the optimizer's step does) invalidates the codes.
  {
    torch::NoGradGuard no_grad;
    for (auto& [n, p] : m->named_parameters())
      if (n.find("codebooks") != std::string::npos) p.mul_(1.5);
  }
  auto [h3, l3, g3] = step(true, nullptr);
  auto [h4, l4, g4] = step(false, nullptr);
  EXPECT_FALSE(torch::allclose(h3, h1, 1e-4, 1e-5)) << "the change shows";
  EXPECT_TRUE(torch::allclose(h3, h4, 1e-5, 1e-6)) << (h3 - h4).abs().max().item<double>();
  // Evaluation mode, no grad: the same.
  m->set_training(false);
  torch::NoGradGuard no_grad;
  auto [e0, el0, eg0] = step(false, &separate_mm);
  auto [e1, el1, eg1] = step(true, &shared_mm);
  EXPECT_TRUE(torch::allclose(e1, e0, 1e-5, 1e-6));
  EXPECT_LT(shared_mm, separate_mm);
  // Without autograd nothing consumes the codes: only the parameters' versions tell that the
  // codes remembered by the last targets() are stale for an inputs-first forward.
  for (auto& [n, p] : m->named_parameters())
    if (n.find("codebooks") != std::string::npos) p.mul_(0.5);
  auto [e2, el2, eg2] = step(false, nullptr);
  auto [e3, el3, eg3] = step(true, nullptr);
  EXPECT_FALSE(torch::allclose(e2, e1, 1e-4, 1e-5)) << "stale codes were reused";
  EXPECT_TRUE(torch::allclose(e2, e3, 1e-5, 1e-6));
}

TEST(Lisa, EmaUpdateMovesCodebooksTowardsAssignedResiduals) {
  auto o = lisa("base");
  o.codebook_update = "ema";
  o.ema_decay = 0.5;
  auto m = make_model(o);
  m->set_training(true);
  auto before = snapshot([&] {
    std::vector<at::Tensor> v;
    for (auto& [n, t] : m->named_buffers()) v.push_back(t);
    return v;
  }());
  m->encode(batch(6, 16, 2));
  m->apply_statistics();
  double moved = 0;
  size_t i = 0;
  for (auto& [n, t] : m->named_buffers()) moved += (t - before[i++]).abs().sum().item<double>();
  EXPECT_GT(moved, 0.0);
}

TEST(Lisa, InputsOptimizeTermOnlyWhenAsked) {
  auto o = lisa("soft");
  o.lisa_commitment = 0.01;
  auto m = make_model(o);
  m->set_training(true);
  m->encode(batch(4, 16, 3));
  auto aux = m->take_auxiliary_loss();
  ASSERT_TRUE(aux.defined());
  EXPECT_GT(aux.item<double>(), 0.0);
  EXPECT_FALSE(m->take_auxiliary_loss().defined()) << "taken once";
  o.lisa_commitment = 0.0;
  auto plain = make_model(o);
  plain->set_training(true);
  plain->encode(batch(4, 16, 3));
  EXPECT_FALSE(plain->take_auxiliary_loss().defined());
}

TEST(Lisa, TargetsFollowTheVariant) {
  torch::NoGradGuard g;
  auto base = make_model(lisa("base")), soft = make_model(lisa("soft"));
  base->set_training(false);
  soft->set_training(false);
  // Base scores quantized targets: at most W^B distinct rows; Soft scores raw (scaled) rows.
  auto tb = base->item_embeddings(), ts = soft->item_embeddings();
  EXPECT_EQ(tb.sizes(), ts.sizes());
  at::Tensor raw;
  for (auto& [n, p] : soft->named_parameters())
    if (n == "item_emb.weight") raw = p;
  EXPECT_TRUE(torch::allclose(ts, raw * std::sqrt(8.0)));
  EXPECT_FALSE(torch::allclose(tb, raw * std::sqrt(8.0), 1e-3, 1e-3));
}

// The state line logged with each evaluation counts what the quantized item table holds: the
// number of distinct full codes is exactly the number of distinct rows of Base's target table.
TEST(Lisa, StateLineCountsCodebookUsageAndCollisions) {
  auto base = make_model(lisa("base"));
  base->set_training(true);  // the line is computed in evaluation mode whatever the caller's
  const std::string line = base->describe_state();
  torch::NoGradGuard g;
  base->set_training(false);
  auto rows = std::get<0>(at::unique_dim(base->item_embeddings().narrow(0, 1, 40), 0)).size(0);
  EXPECT_NE(line.find("distinct item codes " + std::to_string(rows) + "/40"), std::string::npos) << line;
  EXPECT_NE(line.find("sequence codebooks (3 x 6): codewords used per codebook "), std::string::npos) << line;
  EXPECT_EQ(line.find("target codebooks"), std::string::npos) << "Base has one codebook set: " << line;
  auto mini = lisa("mini");
  mini.target_codebooks = 2;
  mini.target_codewords = 9;
  EXPECT_NE(make_model(mini)->describe_state().find("target codebooks (2 x 9)"), std::string::npos);
  auto sasrec = lisa("base");
  sasrec.model = "sasrec";
  EXPECT_TRUE(make_model(sasrec)->describe_state().empty());
}

// §4.8: the per-user state (decayed codeword histogram) scores every step exactly as a full
// forward pass over the history so far.
TEST(Lisa, OnlineStateEqualsTheFullForwardAtEveryStep) {
  for (std::string variant : {"base", "soft", "mini"}) {
    auto o = lisa(variant);
    o.max_len = 40;
    o.blocks = 2;
    o.norm_first = variant != "soft";
    o.target_codebooks = 2;
    o.target_codewords = 5;
    auto m = make_model(o);
    m->set_training(false);
    auto session = m->online_session();
    std::vector<int64_t> history;
    torch::NoGradGuard g;
    for (int64_t t = 0; t < 40; ++t) {
      const int64_t item = 1 + (t * 11 + 3) % 40;
      history.push_back(item);
      auto h = session->push(item);
      auto input = torch::tensor(history, torch::kLong).view({1, -1});
      auto want = m->encode_last(input).view(-1);
      ASSERT_TRUE(torch::allclose(h, want, 1e-5, 1e-5))
          << variant << " step " << t << ": max diff " << (h - want).abs().max().item<double>();
    }
    EXPECT_EQ(session->length(), 40);
  }
}

TEST(Lisa, OnlineStateRejectsBadItemsAndTrainingMode) {
  auto m = make_model(lisa("base"));
  m->set_training(false);
  auto session = m->online_session();
  for (int64_t bad : {int64_t{0}, int64_t{41}, int64_t{-3}}) {
    try {
      session->push(bad);
      ADD_FAILURE() << "no error for item " << bad;
    } catch (const std::out_of_range& e) {
      EXPECT_NE(std::string(e.what()).find("item id " + std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(session->length(), 0);
  m->set_training(true);
  EXPECT_THROW(session->push(3), c10::Error);
  ModelOptions s;
  s.num_items = 10;
  EXPECT_THROW(make_model(s)->online_session(), std::invalid_argument);
}

TEST(Lisa, BadOptionsAreNamed) {
  auto expect_named = [](ModelOptions o, const std::string& what) {
    try {
      make_model(o);
      ADD_FAILURE() << "no error for " << what;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  auto o = lisa("base");
  o.lisa_variant = "huge";
  expect_named(o, "lisa_variant 'huge'");
  o = lisa("base");
  o.codewords = 0;
  expect_named(o, "codewords");
  o = lisa("base");
  o.codebooks = -1;
  expect_named(o, "codebooks");
  o = lisa("mini");
  o.target_codewords = 0;
  expect_named(o, "target_codewords");
  o = lisa("base");
  o.codebook_update = "kmeans";
  expect_named(o, "codebook_update 'kmeans'");
  // A checkpoint's target codebooks that differ from the configuration are named.
  auto a = lisa("mini"), b = lisa("mini");
  b.target_codewords = 64;
  EXPECT_NE(signature_difference(model_signature(a), model_signature(b)).find("target_codewords: 128 vs 64"),
            std::string::npos);
}

}  // namespace
