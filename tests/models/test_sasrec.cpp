#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/model.h"

namespace {
using namespace seqrec::models;

ModelOptions small() {
  ModelOptions o;
  o.num_items = 30;
  o.max_len = 12;
  o.hidden = 8;
  o.blocks = 2;
  o.heads = 2;
  o.dropout = 0.0;
  o.init_seed = 5;
  return o;
}

at::Tensor seq(std::vector<int64_t> items, int64_t L) {
  auto t = torch::zeros({1, L}, torch::kInt64);
  for (size_t i = 0; i < items.size(); ++i) t[0][L - items.size() + i] = items[i];
  return t;
}

class SasRecNorms : public ::testing::TestWithParam<bool> {};

TEST_P(SasRecNorms, PaddingLengthDoesNotChangeRealOutputs) {
  auto o = small();
  o.norm_first = GetParam();
  auto m = make_model(o);
  m->set_training(false);
  torch::NoGradGuard g;
  auto a = m->encode(seq({3, 7, 1, 9}, 5));
  auto b = m->encode(seq({3, 7, 1, 9}, 12));
  EXPECT_TRUE(torch::allclose(a.narrow(1, 1, 4), b.narrow(1, 8, 4), 1e-6, 1e-6));
  EXPECT_EQ(b.narrow(1, 0, 8).abs().sum().item<double>(), 0.0) << "padded slots must be zero";
}

TEST_P(SasRecNorms, FutureItemsDoNotChangeEarlierOutputs) {
  auto o = small();
  o.norm_first = GetParam();
  auto m = make_model(o);
  m->set_training(false);
  torch::NoGradGuard g;
  auto a = m->encode(seq({3, 7, 1, 9, 4}, 8));
  auto b = m->encode(seq({3, 7, 1, 22, 17}, 8));
  EXPECT_TRUE(torch::equal(a.narrow(1, 0, 6), b.narrow(1, 0, 6)));
  EXPECT_FALSE(torch::equal(a.narrow(1, 6, 2), b.narrow(1, 6, 2)));
}
TEST_P(SasRecNorms, EncodeLastEqualsTheLastSlotOfEncode) {
  auto o = small();
  o.norm_first = GetParam();
  auto m = make_model(o);
  m->set_training(false);
  torch::NoGradGuard g;
  auto input = torch::cat({seq({3, 7, 1, 9}, 9), seq({5}, 9), seq({1, 2, 3, 4, 5, 6, 7, 8, 9}, 9)});
  auto full = m->encode(input).select(1, 8);
  auto last = m->encode_last(input);
  EXPECT_TRUE(torch::allclose(full, last, 1e-5, 1e-6)) << (full - last).abs().max();
}

INSTANTIATE_TEST_SUITE_P(PreAndPostLN, SasRecNorms, ::testing::Values(true, false));

TEST(SasRec, InitialisationIsDeterministicInTheSeed) {
  auto a = make_model(small()), b = make_model(small());
  auto o = small();
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
  EXPECT_EQ(a->item_embeddings()[0].abs().sum().item<double>(), 0.0) << "padding row starts at zero";
}

TEST(SasRec, ValidatesOptions) {
  auto o = small();
  o.model = "nosuch";
  EXPECT_THROW(make_model(o), std::invalid_argument);
  o = small();
  o.max_len = 0;
  EXPECT_THROW(make_model(o), std::invalid_argument);
  o = small();
  o.heads = 3;
  EXPECT_THROW(make_model(o), std::invalid_argument);
  o = small();
  o.dropout = 1.0;
  EXPECT_THROW(make_model(o), std::invalid_argument);
}

TEST(SasRec, SignatureRoundTripsAndNamesDifferences) {
  auto o = small();
  EXPECT_EQ(model_signature(parse_model_signature(model_signature(o))), model_signature(o));
  auto p = o;
  p.hidden = 16;
  auto diff = signature_difference(model_signature(o), model_signature(p));
  EXPECT_NE(diff.find("hidden: 8 vs 16"), std::string::npos) << diff;
  EXPECT_TRUE(signature_difference(model_signature(o), model_signature(o)).empty());
}

}  // namespace
