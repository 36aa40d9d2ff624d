// Top-k recommendations (train/recommend.h) against scores computed by hand: a real model's
// hidden state after each history dotted with every item's output representation, the
// padding row and (when asked) the history's items left out, ties ordered by item id.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "models/model.h"
#include "train/recommend.h"

namespace {
using namespace seqrec;

models::ModelOptions small(const std::string& objective = "causal") {
  models::ModelOptions o;
  o.model = "sasrec";
  o.num_items = 40;
  o.max_len = 6;
  o.hidden = 8;
  o.blocks = 1;
  o.heads = 1;
  o.dropout = 0.3;  // recommend must run the model in evaluation mode: no dropout
  o.init_seed = 11;
  o.objective = objective;
  return o;
}

// The k best of every item 1..N by brute force, ties by ascending id.
std::vector<int64_t> brute_top(const at::Tensor& scores, int64_t k, const std::vector<int64_t>& banned) {
  std::vector<int64_t> items;
  for (int64_t i = 1; i < scores.size(0); ++i)
    if (std::find(banned.begin(), banned.end(), i) == banned.end()) items.push_back(i);
  const float* s = scores.data_ptr<float>();
  std::stable_sort(items.begin(), items.end(), [&](int64_t a, int64_t b) { return s[a] != s[b] ? s[a] > s[b] : a < b; });
  items.resize(std::min<size_t>(items.size(), k));
  return items;
}

// A model's scores of every item after `history`, by encode_last on the model's last max_len
// items (left-padded into a row of its own) against item_embeddings.
at::Tensor scores_after(models::SequenceModel& model, std::vector<int64_t> history) {
  torch::NoGradGuard no_grad;
  model.set_training(false);
  const auto& o = model.options();
  const bool cloze = o.objective == "cloze";
  if (cloze) history.push_back(models::mask_item(o));
  const int64_t n = std::min<int64_t>(o.max_len, history.size());
  auto row = torch::tensor(std::vector<int64_t>(history.end() - n, history.end()), torch::kInt64).unsqueeze(0);
  auto h = model.encode_last(row);
  return torch::matmul(h, model.item_embeddings().t()).squeeze(0).contiguous();
}

TEST(Recommend, TopKEqualsTheScoresByHand) {
  for (const std::string objective : {"causal", "cloze"}) {
    auto model = models::make_model(small(objective));
    // Lengths below, at and above max_len (6), in one batch of unequal rows.
    const std::vector<std::vector<int64_t>> histories = {
        {3}, {5, 9, 9, 2}, {1, 2, 3, 4, 5, 6}, {40, 39, 38, 37, 36, 35, 34, 33, 12}};
    for (const bool exclude : {false, true}) {
      auto got = train::recommend_batch(*model, histories, {}, 7, exclude);
      ASSERT_EQ(got.size(), histories.size());
      for (size_t r = 0; r < histories.size(); ++r) {
        auto scores = scores_after(*model, histories[r]);
        const auto want = brute_top(scores, 7, exclude ? histories[r] : std::vector<int64_t>{});
        EXPECT_EQ(got[r].items, want) << objective << " row " << r << (exclude ? " (history excluded)" : "");
        ASSERT_EQ(got[r].scores.size(), want.size());
        for (size_t j = 0; j < want.size(); ++j)
          EXPECT_NEAR(got[r].scores[j], scores[want[j]].item<float>(), 1e-5) << objective << " row " << r;
        if (exclude) {
          for (int64_t item : got[r].items)
            EXPECT_TRUE(std::find(histories[r].begin(), histories[r].end(), item) == histories[r].end())
                << "item " << item << " of the history was recommended";
        }
      }
    }
  }
}

// Scores item i as -|i - 10| (hidden [1, 0]; item rows [-|i - 10|, 0]): ties at 9 and 11, 8 and 12.
class TiedModel : public models::SequenceModel {
 public:
  TiedModel() {
    o_.num_items = 14;
    table_ = torch::zeros({15, 2});
    for (int64_t i = 0; i <= 14; ++i) table_[i][0] = -std::abs(static_cast<double>(i - 10));
  }
  at::Tensor encode(const at::Tensor& input, const models::UserInput& = {}) override {
    auto h = torch::zeros({input.size(0), input.size(1), 2});
    h.select(2, 0).fill_(1);
    return h;
  }
  at::Tensor item_embeddings() override { return table_; }
  models::NamedTensors named_parameters() override { return {}; }
  models::NamedTensors named_buffers() override { return {}; }
  void set_training(bool) override {}
  const models::ModelOptions& options() const override { return o_; }

 private:
  models::ModelOptions o_;
  at::Tensor table_;
};

TEST(Recommend, TiesGoByItemIdAndExclusionCanLeaveFewerThanK) {
  TiedModel model;
  auto got = train::recommend_batch(model, {{1}}, {}, 5, false).front();
  EXPECT_EQ(got.items, (std::vector<int64_t>{10, 9, 11, 8, 12}));
  EXPECT_EQ(got.scores, (std::vector<float>{0, -1, -1, -2, -2}));
  got = train::recommend_batch(model, {{10, 9, 1}}, {}, 3, true).front();
  EXPECT_EQ(got.items, (std::vector<int64_t>{11, 8, 12}));
  // Every item but two in the history: two candidates are left for k = 5.
  std::vector<int64_t> all_but_two;
  for (int64_t i = 1; i <= 14; ++i)
    if (i != 4 && i != 13) all_but_two.push_back(i);
  got = train::recommend_batch(model, {all_but_two}, {}, 5, true).front();
  EXPECT_EQ(got.items, (std::vector<int64_t>{13, 4}));
  // k above the item count returns every item once.
  got = train::recommend_batch(model, {{1}}, {}, 100, false).front();
  EXPECT_EQ(got.items.size(), 14u);
}

TEST(Recommend, BadHistoriesAndKAreNamed) {
  TiedModel model;
  const auto message = [&](const std::vector<std::vector<int64_t>>& h, int64_t k) -> std::string {
    try {
      train::recommend_batch(model, h, {}, k, false);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message({{1, 15}}, 3), "item 15 is outside the model's items 1..14");
  EXPECT_EQ(message({{0}}, 3), "item 0 is outside the model's items 1..14");
  EXPECT_EQ(message({{}}, 3), "a history to recommend after holds no item");
  EXPECT_EQ(message({{2}}, 0), "k must be >= 1, got 0");
  EXPECT_TRUE(train::recommend_batch(model, {}, {}, 3, false).empty());
}

}  // namespace
