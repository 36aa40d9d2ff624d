// Routing attention's model-side pieces: the EMA statistics are sums over slots (so a batch
// split across ranks and all-reduced updates exactly as the whole batch), the update is the
// documented spherical k-means step, the commitment term exists only in training, and bad
// options are named.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "models/model.h"

namespace {
using namespace seqrec::models;

ModelOptions routing_options() {
  ModelOptions o;
  o.model = "routing";
  o.num_items = 40;
  o.max_len = 30;
  o.hidden = 8;
  o.blocks = 2;
  o.heads = 2;
  o.dropout = 0.0;
  o.init_seed = 3;
  o.routing_clusters = 3;
  o.routing_window = 4;
  o.routing_decay = 0.6;
  return o;
}

at::Tensor batch() {
  // Left-padded rows of different lengths, one of them a single item.
  auto t = torch::zeros({4, 30}, torch::kInt64);
  const int64_t lengths[] = {30, 17, 1, 9};
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t i = 0; i < lengths[b]; ++i) t[b][30 - lengths[b] + i] = 1 + (b * 11 + i * 7) % 40;
  return t;
}

at::Tensor buffer(SequenceModel& m, const std::string& name) {
  for (auto& [n, t] : m.named_buffers())
    if (n == name) return t;
  ADD_FAILURE() << "no buffer " << name;
  return {};
}

TEST(Routing, StatisticsOfASplitBatchSumToTheWholeBatchs) {
  auto whole = make_model(routing_options()), split = make_model(routing_options());
  whole->set_training(true);
  split->set_training(true);
  const auto input = batch();
  whole->encode(input);
  split->encode(input.narrow(0, 0, 1));
  split->encode(input.narrow(0, 1, 3));
  auto a = whole->pending_statistics(), b = split->pending_statistics();
  ASSERT_EQ(a.size(), 4u);  // counts and sums of two blocks
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-6, 1e-6)) << i;
  // Counts cover every real slot once per routing head: 30 + 17 + 1 + 9.
  EXPECT_NEAR(a[0].sum().item<double>(), 57.0, 1e-9);
  // Evaluation forwards add nothing.
  whole->apply_statistics();
  whole->set_training(false);
  whole->encode(input);
  for (auto& t : whole->pending_statistics()) EXPECT_EQ(t.abs().sum().item<double>(), 0.0);
}

TEST(Routing, UpdateIsTheSmoothedMeanDirection) {
  auto m = make_model(routing_options());
  m->set_training(true);
  m->encode(batch());
  auto stats = m->pending_statistics();
  auto count0 = buffer(*m, "block0.attn.ema_count").clone(), sum0 = buffer(*m, "block0.attn.ema_sum").clone();
  auto pending_count = stats[0].clone(), pending_sum = stats[1].clone();
  m->apply_statistics();
  const double a = 0.6, eps = 1e-5;
  auto count = count0 * a + pending_count * (1 - a), sum = sum0 * a + pending_sum * (1 - a);
  auto total = count.sum(-1, true);
  auto mean = sum / ((count + eps) / (total + 3 * eps) * total).unsqueeze(-1);
  auto expect = mean / mean.norm(2, -1, true);
  EXPECT_TRUE(torch::allclose(buffer(*m, "block0.attn.centroids"), expect, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(buffer(*m, "block0.attn.ema_count"), count, 1e-6, 1e-6));
  auto norms = buffer(*m, "block1.attn.centroids").norm(2, -1);
  EXPECT_TRUE(torch::allclose(norms, torch::ones_like(norms), 1e-6, 1e-6)) << "centroids stay on the unit sphere";
  for (auto& t : m->pending_statistics()) EXPECT_EQ(t.abs().sum().item<double>(), 0.0) << "pending sums cleared";
}

TEST(Routing, CommitmentTermOnlyInTrainingAndItTrainsTheProjection) {
  auto m = make_model(routing_options());
  m->set_training(false);
  m->encode(batch());
  EXPECT_FALSE(m->take_auxiliary_loss().defined());
  m->set_training(true);
  m->encode(batch());
  auto aux = m->take_auxiliary_loss();
  ASSERT_TRUE(aux.defined());
  EXPECT_GT(aux.item<double>(), 0.0);
  aux.backward();
  bool proj_grad = false;
  for (auto& [n, p] : m->named_parameters())
    if (n.find("attn.proj.weight") != std::string::npos && p.grad().defined()) proj_grad |= p.grad().abs().sum().item<double>() > 0;
  EXPECT_TRUE(proj_grad);
  EXPECT_FALSE(m->take_auxiliary_loss().defined()) << "taking the term clears it";
}

TEST(Routing, BadOptionsAreNamed) {
  auto expect_error = [](void (*set)(ModelOptions&), const std::string& text) {
    auto o = routing_options();
    set(o);
    try {
      validate(o);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error([](ModelOptions& o) { o.routing_heads = 3; }, "routing_heads must be in [1, heads = 2]");
  expect_error([](ModelOptions& o) { o.routing_heads = 0; }, "routing_heads");
  expect_error([](ModelOptions& o) { o.routing_clusters = -1; }, "routing_clusters");
  expect_error([](ModelOptions& o) { o.routing_window = -2; }, "routing_window");
  expect_error([](ModelOptions& o) { o.routing_decay = 1.0; }, "routing_decay must be in (0, 1)");
  expect_error([](ModelOptions& o) { o.routing_commitment = -1; }, "routing_commitment");
}

TEST(Routing, AutomaticSizesFollowTheSquareRootRule) {
  ModelOptions o;
  o.max_len = 200;
  auto s = routing_sizes(o);
  EXPECT_EQ(s.clusters, 14);  // round(sqrt(200))
  EXPECT_EQ(s.window, 15);    // ceil(200 / 14)
  EXPECT_EQ(s.chunk, 15);
  EXPECT_EQ(s.local_window, 30);
  o.routing_clusters = 8;
  o.routing_chunk = 5;
  s = routing_sizes(o);
  EXPECT_EQ(s.window, 25);
  EXPECT_EQ(s.chunk, 5);
  EXPECT_EQ(s.local_window, 10);
}

TEST(ModelOptionTable, EveryKeyRoundTripsAndBadValuesAreNamed) {
  ModelOptions o;
  for (auto& opt : model_option_table()) {
    EXPECT_EQ(get_model_option(o, opt.key), opt.default_text) << opt.key;
    set_model_option(o, opt.key, opt.default_text);
  }
  EXPECT_THROW(set_model_option(o, "no_such_key", "1"), std::invalid_argument);
  try {
    set_model_option(o, "routing_clusters", "12x");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("routing_clusters: bad value '12x'"), std::string::npos) << e.what();
  }
  set_model_option(o, "norm_first", "false");
  EXPECT_FALSE(o.norm_first);
  EXPECT_THROW(set_model_option(o, "norm_first", "maybe"), std::invalid_argument);
}

}  // namespace
