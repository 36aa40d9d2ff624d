// Ranking metrics with exact answers: a fake model whose score for item i is known, so every
// rank (and therefore HR/NDCG/MRR) can be computed by hand. Also the run summary that reads the
// metrics back (train/run_summary.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "dist/comm.h"
#include "tests/test_files.h"
#include "io/dataset.h"
#include "io/remove_tree.h"
#include "models/model.h"
#include "train/evaluator.h"
#include "train/run_lock.h"
#include "train/run_summary.h"

namespace {
using namespace seqrec;

TEST(Metrics, PessimisticRankCountsTiesAgainstTheTarget) {
  const float s1[] = {0.5f, 0.1f, 0.9f, 0.5f, 0.2f};
  EXPECT_EQ(train::pessimistic_rank(s1, 5), 3);  // 0.9 above, 0.5 tied
  const float s2[] = {1.0f, 0.1f, 0.2f};
  EXPECT_EQ(train::pessimistic_rank(s2, 3), 1);
  const float s3[] = {0.0f, 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(train::pessimistic_rank(s3, 4), 4) << "all tied: the target ranks last";
  const float s4[] = {NAN, 0.0f, 1.0f};
  EXPECT_EQ(train::pessimistic_rank(s4, 3), 3) << "a NaN target ranks last";
}

TEST(Metrics, AccumulateRank) {
  std::map<std::string, double> sums;
  train::accumulate_rank(1, {5, 10}, sums);
  train::accumulate_rank(7, {5, 10}, sums);
  EXPECT_DOUBLE_EQ(sums["HR@5"], 1.0);
  EXPECT_DOUBLE_EQ(sums["HR@10"], 2.0);
  EXPECT_DOUBLE_EQ(sums["NDCG@5"], 1.0);
  EXPECT_DOUBLE_EQ(sums["NDCG@10"], 1.0 + 1.0 / std::log2(8.0));
  EXPECT_DOUBLE_EQ(sums["MRR@10"], 1.0 + 1.0 / 7);
  EXPECT_DOUBLE_EQ(sums["MRR"], 1.0 + 1.0 / 7);
}

// Scores item i as i (hidden = [1], embedding of i = [i]); the input is ignored.
class IdentityScoreModel : public models::SequenceModel {
 public:
  explicit IdentityScoreModel(int64_t items) {
    o_.num_items = items;
    table_ = torch::arange(0, items + 1, torch::kFloat32).unsqueeze(1);
  }
  at::Tensor encode(const at::Tensor& input, const models::UserInput& = {}) override {
    return torch::ones({input.size(0), input.size(1), 1});
  }
  at::Tensor item_embeddings() override { return table_; }
  models::NamedTensors named_parameters() override { return {}; }
  models::NamedTensors named_buffers() override { return {}; }
  void set_training(bool) override {}
  const models::ModelOptions& options() const override { return o_; }
  at::Tensor table_;

 private:
  models::ModelOptions o_;
};

struct Fixture {
  io::DatasetMeta meta;
  io::UserSequences seqs;
  Fixture() {
    meta.num_users = 3;
    meta.num_items = 20;
    // user 0: ... valid 15, test 18; user 1: valid 3, test 20; user 2 has 2 items (train only)
    seqs.user_begin = 0;
    seqs.user_end = 3;
    seqs.items = {1, 2, 15, 18, /*u1*/ 4, 5, 6, 3, 20, /*u2*/ 7, 8};
    seqs.offsets = {0, 4, 9, 11};
  }
};

TEST(Evaluator, FullRankingHasExactRanks) {
  Fixture f;
  IdentityScoreModel model(20);
  auto comm = dist::make_local_comm();
  train::EvalProtocol full;
  full.sampled = false;
  train::EvalOptions eo;
  eo.max_len = 5;
  // valid: targets 15 (rank 6 among 1..20) and 3 (rank 18); user 2 is not evaluated.
  auto r = train::evaluate(model, f.seqs, f.meta, train::Split::kValid, full, eo, *comm);
  EXPECT_EQ(r.users, 2);
  EXPECT_DOUBLE_EQ(r.get("HR@10"), 0.5);
  EXPECT_DOUBLE_EQ(r.get("HR@20"), 1.0);
  EXPECT_DOUBLE_EQ(r.get("NDCG@10"), 0.5 / std::log2(7.0));
  EXPECT_DOUBLE_EQ(r.get("MRR"), (1.0 / 6 + 1.0 / 18) / 2);
  // test: targets 18 (rank 3) and 20 (rank 1)
  auto t = train::evaluate(model, f.seqs, f.meta, train::Split::kTest, full, eo, *comm);
  EXPECT_DOUBLE_EQ(t.get("MRR"), (1.0 / 3 + 1.0) / 2);
  // excluding history: user 0's history {1, 2, 15} at test is below 18 anyway; user 1's
  // valid target 3 loses competitors 4, 5, 6 -> rank 15.
  full.exclude_history = true;
  auto x = train::evaluate(model, f.seqs, f.meta, train::Split::kValid, full, eo, *comm);
  EXPECT_DOUBLE_EQ(x.get("MRR"), (1.0 / 6 + 1.0 / 15) / 2);
}

TEST(Evaluator, TiesCountAgainstTheTargetInFullRanking) {
  Fixture f;
  IdentityScoreModel model(20);
  model.table_.fill_(1.0);  // every item ties
  auto comm = dist::make_local_comm();
  train::EvalProtocol full;
  full.sampled = false;
  train::EvalOptions eo;
  eo.max_len = 5;
  auto r = train::evaluate(model, f.seqs, f.meta, train::Split::kTest, full, eo, *comm);
  EXPECT_DOUBLE_EQ(r.get("MRR"), 1.0 / 20) << "20 tied items: the target ranks 20th";
  EXPECT_DOUBLE_EQ(r.get("tied"), 1.0) << "every user's target ties";
  model.table_.copy_(torch::arange(21, torch::kFloat32).unsqueeze(1));  // distinct scores again
  EXPECT_DOUBLE_EQ(train::evaluate(model, f.seqs, f.meta, train::Split::kTest, full, eo, *comm).get("tied"), 0.0);
}

TEST(Evaluator, SampledNegativesAreOutsideTheSequenceAndDeterministic) {
  Fixture f;
  IdentityScoreModel model(20);
  auto comm = dist::make_local_comm();
  train::EvalProtocol s;
  s.negatives = 5;
  train::EvalOptions eo;
  eo.max_len = 5;
  auto a = train::evaluate(model, f.seqs, f.meta, train::Split::kTest, s, eo, *comm);
  auto b = train::evaluate(model, f.seqs, f.meta, train::Split::kTest, s, eo, *comm);
  EXPECT_EQ(a.metrics, b.metrics);
  // user 1's target 20 beats every other item: rank 1 whatever the negatives.
  EXPECT_GE(a.get("MRR"), 0.5);
  // Too many negatives for the catalogue is an error, not an endless loop.
  s.negatives = 19;
  EXPECT_THROW(train::evaluate(model, f.seqs, f.meta, train::Split::kTest, s, eo, *comm), std::exception);
}

TEST(Evaluator, PopularityNegativesFollowTheCounts) {
  Fixture f;
  IdentityScoreModel model(20);
  auto comm = dist::make_local_comm();
  // Only items 16, 17 and 19 have training counts, so every negative is one of them (none is
  // in either user's sequence) and both valid targets (15 and 3) rank 3rd among 1 + 2.
  std::vector<double> popularity(21, 0.0);
  popularity[16] = 5;
  popularity[17] = 1;
  popularity[19] = 2;
  train::EvalProtocol s;
  s.negatives = 2;
  s.popularity = true;
  train::EvalOptions eo;
  eo.max_len = 5;
  auto r = train::evaluate(model, f.seqs, f.meta, train::Split::kValid, s, eo, *comm, &popularity);
  EXPECT_DOUBLE_EQ(r.get("MRR"), 1.0 / 3);
  EXPECT_DOUBLE_EQ(r.get("HR@5"), 1.0);
  // The counts themselves come from the training part of each sequence, summed over ranks.
  auto counts = train::item_popularity(f.seqs, f.meta, *comm);
  EXPECT_EQ(counts[1], 1);   // user 0's train items are {1, 2}
  EXPECT_EQ(counts[15], 0);  // user 0's validation target is not training data
  EXPECT_EQ(counts[7], 1);   // user 2 (2 items) is train only
}

TEST(Evaluator, ProtocolDescriptionsNameEverything) {
  train::EvalProtocol s;
  EXPECT_EQ(s.describe(), "sampled: 1 target + 100 uniform negatives not in the user's sequence");
  EXPECT_EQ(s.key(), "sampled100-uniform");
  s.popularity = true;
  EXPECT_EQ(s.key(), "sampled100-popularity");
  train::EvalProtocol f;
  f.sampled = false;
  EXPECT_EQ(f.key(), "full");
}

// metrics.jsonl lines read back exactly as result_json wrote them, escapes included; a malformed
// line is an error naming what is wrong.
// The progress line's durations, as the trainer writes them and `seqrec info` reads them back.
TEST(RunSummary, ReadsBackTheProgressLinesDurations) {
  EXPECT_EQ(train::format_duration(9.4), "9s");
  EXPECT_EQ(train::format_duration(124), "2m04s");
  EXPECT_EQ(train::format_duration(24180), "6h43m");
  EXPECT_EQ(train::format_duration(-1), "?");
  EXPECT_EQ(train::parse_duration("9s"), 9);
  EXPECT_EQ(train::parse_duration("2m04s"), 124);
  EXPECT_EQ(train::parse_duration(train::format_duration(24180)), 24180);
  EXPECT_EQ(train::parse_duration("?"), -1);
  EXPECT_EQ(train::parse_duration("12"), -1);
  EXPECT_EQ(train::parse_duration(""), -1);
}

TEST(RunSummary, ParsesWhatResultJsonWrites) {
  train::EvalResult r;
  r.split = train::Split::kTest;
  r.users = 6040;
  r.metrics = {{"HR@10", 0.814901}, {"NDCG@10", 0.582483}, {"tied", 0.0}};
  r.seconds = 1.5;
  const auto rec = train::parse_metrics_line(train::result_json(r, "ml \"1m\"\\x", 300, 16800));
  EXPECT_EQ(rec.text.at("dataset"), "ml \"1m\"\\x");
  EXPECT_EQ(rec.text.at("split"), "test");
  EXPECT_EQ(rec.text.at("candidates"), r.protocol.describe());
  EXPECT_DOUBLE_EQ(rec.numbers.at("epoch"), 300);
  EXPECT_DOUBLE_EQ(rec.numbers.at("step"), 16800);
  EXPECT_DOUBLE_EQ(rec.numbers.at("users"), 6040);
  EXPECT_DOUBLE_EQ(rec.numbers.at("NDCG@10"), 0.582483);
  EXPECT_EQ(train::parse_metrics_line("{\"a\":\"\\u00e9\\n\"}").text.at("a"), "\xc3\xa9\n");
  EXPECT_TRUE(train::parse_metrics_line("{ }").numbers.empty());
  for (const std::string bad : {"", "{", "{\"a\":}", "{\"a\":1", "{\"a\":1} x", "{\"a\":\"x}", "{\"a\":1e}", "[1]"})
    EXPECT_THROW(train::parse_metrics_line(bad), std::invalid_argument) << bad;
}

// A run's summary: where training stands, the selected epoch with every protocol validated
// there, the test evaluation (and a warning when the test split was evaluated more than once),
// the time and peak memory; a malformed metrics line names the file and line.
TEST(RunSummary, DescribesSelectionTestAndStatus) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("seqrec-run-summary-" + std::to_string(::getpid()));
  seqrec::io::remove_tree(dir);
  fs::create_directories(dir);
  const auto write = [&](const std::string& name, const std::string& text) { std::ofstream(dir / name) << text; };
  const std::string sampled = "sampled: 1 target + 100 uniform negatives not in the user's sequence";
  const auto rec = [&](const char* split, int epoch, int step, const std::string& cand, double ndcg) {
    return std::string("{\"dataset\":\"ml-1m\",\"split\":\"") + split + "\",\"epoch\":" + std::to_string(epoch) +
           ",\"step\":" + std::to_string(step) + ",\"protocol\":\"p\",\"candidates\":\"" + cand +
           "\",\"tie\":\"pessimistic\",\"users\":6040,\"NDCG@10\":" + std::to_string(ndcg) +
           ",\"HR@10\":0.5,\"MRR\":0.25,\"tied\":0,\"seconds\":1}\n";
  };
  const std::string log_head =
      "[setup] dataset=ml-1m users=6040\n[setup] model=linrec params=1 max_len=200\n"
      "[setup] model selection: valid NDCG@10 under \"" + sampled + "\"\n";
  write("train.log", log_head + "[train] epoch 4/10 step 40 loss 1\n[select] new best valid NDCG@10=0.6000 at epoch 5\n" +
                         "[train] epoch 9/10 step 90 loss 1\n[stop] stop requested: checkpoint written at step 100\n" +
                         "[done] steps=100 train time/epoch=14.37 s peak RSS/rank=513 MiB\n");
  write("metrics.jsonl", rec("valid", 5, 50, sampled, 0.6) + rec("valid", 5, 50, "full ranking", 0.06) +
                             rec("valid", 10, 100, sampled, 0.59));
  auto text = train::describe_run(dir.string());
  EXPECT_NE(text.find("model: linrec, dataset: ml-1m, sittings: 1"), std::string::npos) << text;
  EXPECT_NE(text.find("100 steps (the last progress line in epoch 9 of 10); 2 validation(s), the last at epoch 10"),
            std::string::npos) << text;
  EXPECT_NE(text.find("status: stopped (stop requested"), std::string::npos) << text;
  EXPECT_NE(text.find("selected on valid NDCG@10 under \"" + sampled + "\": NDCG@10=0.6000 at epoch 5"), std::string::npos) << text;
  EXPECT_NE(text.find("\"full ranking\" (tie=pessimistic, users=6040): HR@10=0.5000 NDCG@10=0.0600 MRR=0.2500 tied=0.0000"),
            std::string::npos) << text;
  EXPECT_EQ(text.find("NDCG@10=0.5900"), std::string::npos) << "epoch 10 was not selected: " << text;
  EXPECT_NE(text.find("valid NDCG@10 by epoch: 5:0.6000 10:0.5900\n"), std::string::npos)
      << "the selection protocol's curve, not the full-ranking one: " << text;
  EXPECT_EQ(text.find("test ("), std::string::npos) << text;
  EXPECT_NE(text.find("time: 14.37 s/epoch training"), std::string::npos) << text;
  EXPECT_NE(text.find("peak RSS/rank 513 MiB"), std::string::npos) << text;
  EXPECT_EQ(text.find(", on "), std::string::npos) << "a CPU run names no device: " << text;
  // A sitting on a GPU says so, with its peak GPU memory.
  write("train.log", "[setup] dataset=ml-1m users=6040 ranks=1 threads/rank=2 device=cuda:0\n"
                     "[setup] model=linrec params=1 max_len=200\n"
                     "[done] steps=100 train time/epoch=3.76 s peak RSS/rank=1288 MiB peak GPU memory allocated=752 MiB\n");
  text = train::describe_run(dir.string());
  EXPECT_NE(text.find("time: 3.76 s/epoch training (the last finished sitting, on cuda:0), peak RSS/rank 1288 MiB, "
                      "peak GPU memory allocated 752 MiB"),
            std::string::npos) << text;

  // A second sitting that finished and tested; then the run extended and tested again.
  write("train.log", log_head + "[select] new best valid NDCG@10=0.6000 at epoch 5\n[done] steps=100 train time/epoch=14.37 s peak RSS/rank=513 MiB\n" +
                         log_head + "[train] epoch 10/10 step 100 loss 1\n[done] steps=100 train time/epoch=12.00 s peak RSS/rank=400 MiB\n" +
                         "[test] model selected on valid NDCG@10 at epoch 5\n");
  std::ofstream(dir / "metrics.jsonl", std::ios::app) << rec("test", 5, 100, sampled, 0.58) + rec("test", 5, 100, "full ranking", 0.05);
  text = train::describe_run(dir.string());
  EXPECT_NE(text.find("sittings: 2"), std::string::npos) << text;
  EXPECT_NE(text.find("status: finished"), std::string::npos) << text;
  EXPECT_NE(text.find("test (model selected on valid NDCG@10 at epoch 5; epoch 5):"), std::string::npos) << text;
  EXPECT_NE(text.find("HR@10=0.5000 NDCG@10=0.5800"), std::string::npos) << text;
  EXPECT_NE(text.find("time: 12.00 s/epoch"), std::string::npos) << text;
  EXPECT_NE(text.find("peak RSS/rank 513 MiB"), std::string::npos) << "the largest sitting's: " << text;
  EXPECT_EQ(text.find("WARNING"), std::string::npos) << text;
  std::ofstream(dir / "metrics.jsonl", std::ios::app) << rec("test", 5, 200, sampled, 0.57);
  text = train::describe_run(dir.string());
  EXPECT_NE(text.find("WARNING: the test split was evaluated 2 times, the last shown"), std::string::npos) << text;
  EXPECT_NE(text.find("NDCG@10=0.5700"), std::string::npos) << text;
  EXPECT_EQ(text.find("NDCG@10=0.5800"), std::string::npos) << "only the last evaluation: " << text;

  // A sitting that ended on an error is reported as failed, with the error, until a later
  // sitting starts.
  const std::string finished_log = log_head + "[select] new best valid NDCG@10=0.6000 at epoch 5\n" +
                                   "[test] model selected on valid NDCG@10 at epoch 5\n";
  write("train.log", finished_log + log_head + "[error] checkpoint step-00000200: shared.bin is truncated\n");
  text = train::describe_run(dir.string());
  EXPECT_NE(text.find("status: failed (checkpoint step-00000200: shared.bin is truncated)"), std::string::npos) << text;
  write("train.log", finished_log + "[error] step-5 was written by another configuration:\n[error]   hidden: 16 vs 24\n" +
                         "[error]   heads: 1 vs 2\n");
  text = train::describe_run(dir.string());
  EXPECT_NE(text.find("status: failed (step-5 was written by another configuration: hidden: 16 vs 24; heads: 1 vs 2)\n"),
            std::string::npos) << text;
  write("train.log", finished_log + log_head + "[error] x\n" + log_head + "[train] epoch 10/10 step 100 loss 1\n");
  text = train::describe_run(dir.string());
  EXPECT_EQ(text.find("failed"), std::string::npos) << "a later sitting started: " << text;

  std::ofstream(dir / "metrics.jsonl", std::ios::app) << "{\"split\":\"valid\",\"epoch\":\n";
  try {
    train::describe_run(dir.string());
    ADD_FAILURE() << "a malformed line was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl line 7: not a metrics record"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(train::is_run_directory(dir.string()));
  // The dataset's name from the log when no evaluation has been written yet.
  fs::remove(dir / "metrics.jsonl");
  write("train.log", "[setup] dataset=synth users=300\n[setup] model=sasrec params=1\n");
  text = train::describe_run(dir.string());
  EXPECT_NE(text.find("model: sasrec, dataset: synth, sittings: 1"), std::string::npos) << text;
  EXPECT_FALSE(train::is_run_directory((dir / "nothing").string()));
  seqrec::io::remove_tree(dir);
}

// Run directories as the trainer leaves them, for the `seqrec info RUN RUN...` tests: each
// selected at epoch 5 on valid sampled NDCG@10, tested once (sampled and full ranking) or not yet.
class FakeRuns {
 public:
  explicit FakeRuns(const std::string& name)
      : root_(std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()))) {
    seqrec::io::remove_tree(root_);
  }
  ~FakeRuns() { seqrec::io::remove_tree(root_); }

  static inline const std::string sampled = "sampled: 1 target + 100 uniform negatives not in the user's sequence";
  static inline const std::string full = "full ranking over all items, history not excluded";

  static std::string rec(const char* split, int epoch, int step, const std::string& cand, double ndcg, double hr) {
    return std::string("{\"dataset\":\"ml-1m\",\"split\":\"") + split + "\",\"epoch\":" + std::to_string(epoch) +
           ",\"step\":" + std::to_string(step) + ",\"candidates\":\"" + cand + "\",\"tie\":\"pessimistic\",\"users\":6040" +
           ",\"NDCG@10\":" + std::to_string(ndcg) + ",\"HR@10\":" + std::to_string(hr) +
           ",\"MRR\":0.5,\"tied\":0,\"seconds\":1}\n";
  }

  // A run: flags.txt from `flags` (its model named in the log as in them, linrec by default),
  // selected at epoch 5 (valid `valid`), tested when `test` >= 0 (sampled NDCG@10 `test`, full
  // ranking NDCG@10 test / 10). With another `protocol` than `sampled` the run selects under it
  // and is tested under it alone (NDCG@10 `test`).
  std::string make(const std::string& name, const std::string& flags, double valid, double test,
                   const std::string& protocol = sampled) const {
    const std::filesystem::path dir = root_ / name;
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "flags.txt") << flags;
    const auto at = flags.find("model=");
    const std::string model = at == std::string::npos ? "linrec" : flags.substr(at + 6, flags.find('\n', at) - at - 6);
    std::string log = "[setup] dataset=ml-1m users=6040\n[setup] model=" + model + " params=1\n"
                      "[setup] model selection: valid NDCG@10 under \"" + protocol + "\"\n"
                      "[select] new best valid NDCG@10=" + std::to_string(valid) + " at epoch 5\n";
    std::string metrics = rec("valid", 5, 50, protocol, valid, 0.8) + rec("valid", 5, 50, full, 0.06, 0.14) +
                          rec("valid", 10, 100, protocol, valid - 0.01, 0.8);
    if (test >= 0) {
      log += "[test] model selected on valid NDCG@10 at epoch 5\n";
      metrics += protocol != sampled ? rec("test", 5, 100, protocol, test, 0.81)
                                     : rec("test", 5, 100, sampled, test, 0.81) + rec("test", 5, 100, full, test / 10, 0.13);
    }
    std::ofstream(dir / "train.log") << log;
    std::ofstream(dir / "metrics.jsonl") << metrics;
    return dir.string();
  }

  std::string missing() const { return (root_ / "nothing").string(); }

 private:
  std::filesystem::path root_;
};

// Several runs side by side: one row each (model, seed, status, selection, each protocol's test
// figures), the protocols numbered, and the runs that differ only in the seed (and in how they
// were executed) grouped with the mean and sample standard deviation of their finished runs.
// An unfinished run is in progress while a trainer holds its lock, interrupted once none does;
// without a .lock file (a run older than the lock) the summary cannot tell and says so.
TEST(RunSummary, TellsARunInProgressFromAnInterruptedOne) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("seqrec-run-lock-" + std::to_string(::getpid()));
  seqrec::io::remove_tree(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "train.log") << "[setup] dataset=ml-1m users=6040\n[setup] model=linrec params=1 max_len=200\n"
                                      "[train] epoch 4/10 step 40 loss 1\n";
  EXPECT_EQ(train::run_lock_holder(dir.string()).state, train::RunLockHolder::State::kUnknown);
  EXPECT_NE(train::describe_run(dir.string()).find("status: in progress or interrupted (no test evaluation yet)"),
            std::string::npos);
  {
    train::RunDirLock lock;
    ASSERT_EQ(lock.acquire(dir.string()), "");
    const auto held = train::run_lock_holder(dir.string());
    EXPECT_EQ(held.state, train::RunLockHolder::State::kHeld);
    EXPECT_EQ(held.pid, ::getpid());
    const auto text = train::describe_run(dir.string());
    EXPECT_NE(text.find("status: in progress (pid " + std::to_string(::getpid()) + " on this machine holds the run's lock)"),
              std::string::npos) << text;
    // Asking took nothing: a second trainer is still refused, naming the holder.
    train::RunDirLock second;
    EXPECT_NE(second.acquire(dir.string()).find("is in use by another seqrec train (pid " + std::to_string(::getpid())),
              std::string::npos);
    // A held lock outranks what an earlier sitting's log says (an extended run that tested before).
    std::ofstream(dir / "train.log", std::ios::app) << "[test] model selected on valid NDCG@10 at epoch 5\n";
    EXPECT_NE(train::describe_run(dir.string()).find("status: in progress (pid"), std::string::npos);
    const std::string table = train::compare_runs({dir.string(), dir.string()}, {"NDCG@10"});
    EXPECT_NE(table.find(" running "), std::string::npos) << table;
    std::ofstream(dir / "train.log") << "[setup] dataset=ml-1m users=6040\n[train] epoch 4/10 step 40 loss 1\n";
  }
  EXPECT_EQ(train::run_lock_holder(dir.string()).state, train::RunLockHolder::State::kFree);
  const auto text = train::describe_run(dir.string());
  EXPECT_NE(text.find("status: interrupted (no test evaluation, and no trainer on this machine holds the run's lock: "
                      "continue it with --resume auto)"),
            std::string::npos) << text;
  seqrec::io::remove_tree(dir);
}

// An unfinished run under --patience says how many validations it has gone without a new best
// and after which epoch's validation it stops unless one improves; while a trainer runs it, how
// long that is at its pace.
TEST(RunSummary, SaysWhereAPatientRunWouldStop) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("seqrec-run-patience-" + std::to_string(::getpid()));
  seqrec::io::remove_tree(dir);
  fs::create_directories(dir);
  const std::string sampled = "sampled: 1 target + 100 uniform negatives not in the user's sequence";
  const auto valid = [&](int epoch, double ndcg) {
    return "{\"dataset\":\"ml-1m\",\"split\":\"valid\",\"epoch\":" + std::to_string(epoch) +
           ",\"step\":1,\"protocol\":\"p\",\"candidates\":\"" + sampled + "\",\"tie\":\"pessimistic\",\"users\":10,"
           "\"NDCG@10\":" + std::to_string(ndcg) + ",\"tied\":0,\"seconds\":1}\n";
  };
  const auto log = [&](int planned) {
    std::ofstream(dir / "train.log") << "[setup] dataset=ml-1m users=10\n[setup] model=sasrec params=1 max_len=20\n"
                                        "[setup] model selection: valid NDCG@10 under \"" + sampled + "\"\n"
                                        "[select] new best valid NDCG@10=0.6200 at epoch 10\n"
                                        "[train] epoch 16/" + std::to_string(planned) + " step 160 loss 1\n";
  };
  std::ofstream(dir / "flags.txt") << "# seqrec train\n--patience=3\n--eval_every=5\n--seed=1\n";
  std::ofstream(dir / "metrics.jsonl") << valid(5, 0.60) + valid(10, 0.62) + valid(15, 0.61);
  log(100);
  auto text = train::describe_run(dir.string());
  EXPECT_NE(text.find("  patience: 1 of 3 validation(s) since the best (epoch 10) without a new best; unless one "
                      "improves, it stops after validating epoch 25 (planned: 100)\n"),
            std::string::npos) << text;
  EXPECT_EQ(text.find("time left"), std::string::npos) << "no trainer holds the run: " << text;
  // While a trainer holds the run (here the test), the time left at the last progress line's
  // pace: 840 steps to the planned 100 epochs of 10 steps in 14 minutes is a second a step, and
  // patience's stop after epoch 25 is 90 steps away.
  std::ofstream(dir / "train.log") << "[setup] dataset=ml-1m users=10\n"
                                      "[setup] model=sasrec params=1 max_len=20 steps/epoch=10 length_groups=1\n"
                                      "[setup] model selection: valid NDCG@10 under \"" + sampled + "\"\n"
                                      "[select] new best valid NDCG@10=0.6200 at epoch 10\n"
                                      "[train] epoch 16/100 step 160 loss 1 lr 0.001 seq/s 5 ETA(epochs) 14m00s RSS/rank 9 MiB\n";
  {
    train::RunDirLock lock;
    ASSERT_EQ(lock.acquire(dir.string()), "");
    text = train::describe_run(dir.string());
    EXPECT_NE(text.find("  time left: about 14m00s to the planned last epoch, about 1m30s to the patience stop after "
                        "epoch 25 (at this sitting's pace, from the last progress line, written "),
              std::string::npos) << text;
  }
  log(20);  // the planned epochs come first
  text = train::describe_run(dir.string());
  EXPECT_NE(text.find("without a new best; it runs to its planned last epoch, 20\n"), std::string::npos) << text;
  // Not for a finished run, nor without --patience.
  std::ofstream(dir / "train.log", std::ios::app) << "[test] model selected on valid NDCG@10 at epoch 10\n";
  EXPECT_EQ(train::describe_run(dir.string()).find("patience:"), std::string::npos);
  log(100);
  std::ofstream(dir / "flags.txt") << "# seqrec train\n--patience=0\n--eval_every=5\n";
  EXPECT_EQ(train::describe_run(dir.string()).find("patience:"), std::string::npos);
  seqrec::io::remove_tree(dir);
}

TEST(RunSummary, ComparesRunsAndGroupsSeeds) {
  FakeRuns farm("seqrec-run-compare");
  const std::string& sampled = FakeRuns::sampled;
  const std::string& full = FakeRuns::full;
  const auto rec = &FakeRuns::rec;
  const std::string base = "model=linrec\nhidden=50\nthreads=1\n";
  const auto a = farm.make("a", base + "seed=42\nout=a\n", 0.61, 0.58);
  const auto b = farm.make("b", base + "seed=43\nout=b\nresume=auto\nthreads=2\n", 0.63, 0.60);
  const auto c = farm.make("c", base + "seed=44\nout=c\n", 0.62, -1);           // still training
  const auto d = farm.make("d", "model=linrec\nhidden=64\nseed=42\n", 0.70, 0.65);  // another setting

  const std::string text = train::compare_runs({a, b, c, d}, {"HR@10", "NDCG@10"});
  EXPECT_NE(text.find("4 runs; test figures are each run's model selected on validation (valid NDCG@10 under \"" +
                      sampled + "\")"), std::string::npos) << text;
  EXPECT_NE(text.find("  [1] \"" + sampled + "\"\n  [2] \"" + full + "\"\n"), std::string::npos) << text;
  EXPECT_NE(text.find("valid NDCG@10  [1] HR@10  [1] NDCG@10  [2] HR@10  [2] NDCG@10"), std::string::npos) << text;
  const auto row = [&](const std::string& dir) {
    const auto at = text.find(dir + " ");
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
  };
  // Columns are padded to the widest cell; compare with the padding squeezed out.
  const auto squeeze = [](std::string s) {
    std::string out;
    for (char ch : s)
      if (ch != ' ' || out.empty() || out.back() != ' ') out += ch;
    return out;
  };
  EXPECT_EQ(squeeze(row(a)), a + " linrec 42 finished 5 0.6100 0.8100 0.5800 0.1300 0.0580") << text;
  EXPECT_EQ(squeeze(row(c)), c + " linrec 44 unfinished 5 so far 0.6200 - - - -") << text;
  // a and b differ in seed, output, resume and threads only: one group; c is not finished; d's
  // width differs, which names the group. Sample standard deviation of (0.58, 0.60) is 0.0141.
  EXPECT_NE(text.find("  linrec (hidden=50), 3 runs, 2 finished (seeds 42, 43): valid 0.6200 +- 0.0141; [1] HR@10 0.8100 +- 0.0000; "
                      "[1] NDCG@10 0.5900 +- 0.0141; [2] HR@10 0.1300 +- 0.0000; [2] NDCG@10 0.0590 +- 0.0014\n"),
            std::string::npos) << text;
  EXPECT_EQ(text.find("seeds 42)"), std::string::npos) << "d is alone in its group: " << text;
  EXPECT_EQ(text.find("builds"), std::string::npos) << "no run logged its build: " << text;

  // Runs trained by more than one build are listed by build (a run resumed by another build under
  // each); one build, or runs that logged none, add nothing.
  const auto sitting_by = [](const std::string& dir, const std::string& build, bool first) {
    std::string log = seqrec::testing::read_file(dir + "/train.log");
    const std::string line = "[setup] build: " + build + "\n";
    if (first) log.insert(log.find('\n') + 1, line);
    else log += "[setup] dataset=ml-1m users=6040\n" + line;
    std::ofstream(std::filesystem::path(dir) / "train.log") << log;
  };
  sitting_by(a, "seqrec aaa (toy)", true);
  sitting_by(b, "seqrec aaa (toy)", true);
  EXPECT_EQ(train::compare_runs({a, b, c}, {"NDCG@10"}).find("builds"), std::string::npos);
  sitting_by(b, "seqrec bbb (toy)", false);
  sitting_by(c, "seqrec bbb (toy)", true);
  const std::string builds = train::compare_runs({a, b, c}, {"NDCG@10"});
  EXPECT_NE(builds.find("trained by 2 builds (a run resumed by another build under each):\n  seqrec aaa (toy): " + a + " " +
                        b + "\n  seqrec bbb (toy): " + b + " " + c + "\n"),
            std::string::npos)
      << builds;

  // Two groups of one model are each named by the flags that set them apart; execution flags
  // (threads, resume, out) and the seed name none.
  const auto e = farm.make("e", "model=linrec\nhidden=64\nseed=43\nthreads=2\n", 0.72, 0.67);
  const std::string pair = train::compare_runs({a, b, d, e}, {"NDCG@10"});
  EXPECT_NE(pair.find("  linrec (hidden=50), 2 runs, 2 finished (seeds 42, 43): valid 0.6200"), std::string::npos) << pair;
  EXPECT_NE(pair.find("  linrec (hidden=64), 2 runs, 2 finished (seeds 42, 43): valid 0.7100"), std::string::npos) << pair;

  // A group with one finished run says so; a run tested twice is marked.
  std::ofstream(std::filesystem::path(a) / "metrics.jsonl", std::ios::app) << rec("test", 5, 300, sampled, 0.57, 0.8);
  const std::string two = train::compare_runs({a, c}, {"NDCG@10"});
  EXPECT_NE(two.find("linrec, 2 runs, 1 finished (seeds 42): too few finished runs for a spread"), std::string::npos) << two;
  EXPECT_NE(two.find("finished (test x2)"), std::string::npos) << two;
  EXPECT_NE(two.find("0.5700"), std::string::npos) << "the last test evaluation: " << two;

  // Bad input: one directory, no metric, a metric nobody recorded, a directory that is no run.
  EXPECT_THROW(train::compare_runs({a}, {"NDCG@10"}), std::invalid_argument);
  EXPECT_THROW(train::compare_runs({a, b}, {}), std::invalid_argument);
  try {
    train::compare_runs({a, b}, {"NDGC@10"});
    ADD_FAILURE() << "an unknown metric was accepted";
  } catch (const std::invalid_argument& e) {
    // Every recorded figure is offered, those without an "@k" too; bookkeeping fields are not.
    EXPECT_NE(std::string(e.what()).find("'NDGC@10' (they have HR@10, MRR, NDCG@10, tied)"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(train::compare_runs({a, b}, {"MRR"}));
  EXPECT_THROW(train::compare_runs({a, b}, {"seconds"}), std::invalid_argument);
  EXPECT_THROW(train::compare_runs({a, farm.missing()}, {"NDCG@10"}), std::invalid_argument);
}

// Validation curves side by side: a row per epoch any run validated, "-" where one did not, "*"
// at each run's selected epoch, the best row, and for two runs of one selection figure their
// difference; runs selecting differently are named each with its own figure.
TEST(RunSummary, ComparesValidationCurves) {
  FakeRuns farm("seqrec-run-curves");
  const auto rec = &FakeRuns::rec;
  // make() validates epochs 5 (the selected) and 10 under the sampled protocol, plus full ranking
  // at 5, which the curve must not take.
  const auto a = farm.make("a", "model=linrec\nseed=42\n", 0.61, 0.58);
  const auto b = farm.make("b", "model=linrec\nseed=43\n", 0.63, -1);
  // b goes on to epoch 15 and validates epoch 10 a second time after a resume: the last counts.
  std::ofstream(std::filesystem::path(b) / "metrics.jsonl", std::ios::app)
      << rec("valid", 10, 100, FakeRuns::sampled, 0.64, 0.8) + rec("valid", 15, 150, FakeRuns::sampled, 0.65, 0.8);
  const std::string text = train::compare_curves({a, b});
  EXPECT_NE(text.find("valid NDCG@10 under \"" + FakeRuns::sampled + "\" at every validated epoch"), std::string::npos)
      << text;
  EXPECT_NE(text.find("  [1] " + a + "\n  [2] " + b + "\n"), std::string::npos) << text;
  const auto squeeze = [](std::string s) {
    std::string out;
    for (char ch : s)
      if (ch != ' ' || (!out.empty() && out.back() != ' ' && out.back() != '\n')) out += ch;
    return out;
  };
  EXPECT_NE(squeeze(text).find("epoch [1] [2] [2] - [1]\n5 0.6100* 0.6300* +0.0200\n10 0.6000 0.6400 +0.0400\n"
                               "15 - 0.6500 -\nbest 0.6100 (5) 0.6500 (15)\n"),
            std::string::npos)
      << text;
  // One run: its curve alone, no difference column.
  const std::string one = train::compare_curves({a});
  EXPECT_NE(squeeze(one).find("epoch [1]\n5 0.6100*\n10 0.6000\nbest 0.6100 (5)\n"), std::string::npos) << one;
  // Three runs: no difference column either.
  EXPECT_EQ(train::compare_curves({a, b, a}).find("[2] - [1]"), std::string::npos);
  // A run selecting under full ranking: each run's figure is named and no difference is taken.
  const auto c = farm.make("c", "model=linrec\nseed=44\n", 0.07, 0.06, FakeRuns::full);
  const std::string mixed = train::compare_curves({a, c});
  EXPECT_NE(mixed.find("each run's valid selection figure (named below)"), std::string::npos) << mixed;
  EXPECT_NE(mixed.find("  [2] " + c + ": NDCG@10 under \"" + FakeRuns::full + "\"\n"), std::string::npos) << mixed;
  EXPECT_EQ(mixed.find("[2] - [1]"), std::string::npos) << mixed;
  // (make() records c's epoch 5 under full ranking twice, 0.07 then 0.06: the last counts.)
  EXPECT_NE(squeeze(mixed).find("5 0.6100* 0.0600*\n"), std::string::npos) << mixed;
  // Bad input: nothing, or a directory that is no run.
  EXPECT_THROW(train::compare_curves({}), std::invalid_argument);
  EXPECT_THROW(train::compare_curves({a, farm.missing()}), std::invalid_argument);
}

// Two groups with seeds in common are compared seed by seed: the later group minus the earlier,
// over the seeds both finished, with the mean, the sample standard deviation and the 95%
// t-interval of the differences; a seed only one group finished, or one group finished twice,
// pairs nothing, and fewer than two pairs give no line.
TEST(RunSummary, PairsGroupsBySeed) {
  FakeRuns farm("seqrec-run-pairs");
  std::vector<std::string> dirs;
  // SASRec at seeds 42-44 (test sampled NDCG@10 0.60, 0.61, 0.59); LinRec at 42-45 (0.59, 0.605,
  // 0.583, then 0.70 at a seed SASRec lacks); LinRec's seed 46 twice, SASRec's once.
  const double sasrec[] = {0.60, 0.61, 0.59, -1, 0.60}, linrec[] = {0.59, 0.605, 0.583, 0.70, 0.50};
  for (int s = 0; s < 5; ++s) {
    const std::string seed = std::to_string(42 + s);
    if (sasrec[s] >= 0) dirs.push_back(farm.make("sasrec-" + seed, "model=sasrec\nhidden=50\nseed=" + seed + "\n", 0.62, sasrec[s]));
  }
  for (int s = 0; s < 5; ++s) {
    const std::string seed = std::to_string(42 + s);
    dirs.push_back(farm.make("linrec-" + seed, "model=linrec\nhidden=50\nseed=" + seed + "\n", 0.61 - 0.001 * s, linrec[s]));
  }
  dirs.push_back(farm.make("linrec-46b", "model=linrec\nhidden=50\nseed=46\nthreads=2\n", 0.5, 0.4));
  const std::string text = train::compare_runs(dirs, {"NDCG@10"});
  // Differences at 42, 43, 44: valid -0.010, -0.011, -0.012; sampled -0.010, -0.005, -0.007 (mean
  // -0.00733, sd 0.00252, half-width t(2) 4.303 x 0.00252 / sqrt(3) = 0.00625); full a tenth.
  EXPECT_NE(text.find("paired by seed (the later group minus the earlier"), std::string::npos) << text;
  EXPECT_NE(text.find("  linrec minus sasrec (seeds 42, 43, 44): valid -0.0110 +- 0.0010 [-0.0135, -0.0085]; "
                      "[1] NDCG@10 -0.0073 +- 0.0025 [-0.0136, -0.0011]; [2] NDCG@10 -0.0007 +- 0.0003 [-0.0014, -0.0001]\n"),
            std::string::npos)
      << text;
  // Without a second seed in common there is nothing to pair.
  const std::string one = train::compare_runs({dirs[0], dirs[4], dirs[5]}, {"NDCG@10"});
  EXPECT_EQ(one.find("paired by seed"), std::string::npos) << one;
  // The t quantile beyond its table (31 degrees of freedom, 2.0395): 32 pairs whose differences
  // alternate 0 and -0.1 (mean -0.05, sd 0.0508, half-width 0.0183; the normal quantile would
  // give 0.0176).
  FakeRuns many("seqrec-run-pairs-many");
  std::vector<std::string> big;
  for (int s = 0; s < 32; ++s) {
    const std::string seed = std::to_string(100 + s);
    big.push_back(many.make("a" + seed, "model=sasrec\nseed=" + seed + "\n", 0.6, 0.6));
    big.push_back(many.make("b" + seed, "model=linrec\nseed=" + seed + "\n", 0.6, s % 2 ? 0.5 : 0.6));
  }
  const std::string wide = train::compare_runs(big, {"NDCG@10"});
  EXPECT_NE(wide.find("[1] NDCG@10 -0.0500 +- 0.0508 [-0.0683, -0.0317]"), std::string::npos) << wide;
  // Seeds in common but no figure on both sides: the LinRec runs select and test under
  // popularity-sampled candidates alone, so neither the valid column (another selection) nor a
  // test protocol is shared.
  const std::string pop = "sampled: 1 target + 100 popularity-weighted negatives not in the user's sequence";
  FakeRuns apart("seqrec-run-pairs-apart");
  std::vector<std::string> two;
  for (const char* seed : {"42", "43"}) {
    two.push_back(apart.make(std::string("s") + seed, std::string("model=sasrec\nseed=") + seed + "\n", 0.62, 0.6));
    two.push_back(apart.make(std::string("l") + seed, std::string("model=linrec\nseed=") + seed + "\n", 0.5, 0.45, pop));
  }
  const std::string none = train::compare_runs(two, {"NDCG@10"});
  EXPECT_NE(none.find("  linrec minus sasrec (seeds 42, 43): too few pairs with a figure on both sides\n"),
            std::string::npos)
      << none;
}

// --patience ends a run early and nothing else (selection looks at every validation), so runs
// that differ in it are alike where it stopped none of them: each trained every epoch it planned.
// A run it stopped short stays apart, named by its patience; a group is named only by the flags
// its members agree on.
TEST(RunSummary, APatienceThatStoppedNoRunSplitsNoGroup) {
  FakeRuns farm("seqrec-run-patience");
  const auto run = [&](const std::string& name, const std::string& flags, int last_epoch, double test,
                       const std::string& model = "sasrec") {
    const std::string dir = farm.make(name, "model=" + model + "\nepochs=10\n" + flags, 0.62, test);
    std::ofstream(std::filesystem::path(dir) / "train.log", std::ios::app)
        << "[train] epoch " << last_epoch << "/10 step " << 10 * last_epoch << " loss 1.0 lr 0.001\n";
    return dir;
  };
  const std::string a42 = run("a42", "seed=42\npatience=10\n", 10, 0.60), a43 = run("a43", "seed=43\npatience=0\n", 10, 0.62);
  const std::string b42 = run("b42", "seed=42\npatience=0\n", 10, 0.59, "linrec");
  const std::string b43 = run("b43", "seed=43\npatience=0\n", 10, 0.60, "linrec");
  std::string text = train::compare_runs({a42, a43, b42, b43}, {"NDCG@10"});
  EXPECT_NE(text.find("  sasrec, 2 runs, 2 finished (seeds 42, 43): valid 0.6200 +- 0.0000; [1] NDCG@10 0.6100 +- 0.0141"),
            std::string::npos) << text;
  EXPECT_NE(text.find("  linrec minus sasrec (seeds 42, 43):"), std::string::npos) << text;
  // Stopped by its patience at epoch 7 of 10: its own group, named by it; the two that trained
  // every epoch disagree on the patience, so their group's name leaves it out.
  const std::string a44 = run("a44", "seed=44\npatience=5\n", 7, 0.61), a45 = run("a45", "seed=45\npatience=5\n", 7, 0.63);
  text = train::compare_runs({a42, a43, a44, a45}, {"NDCG@10"});
  EXPECT_NE(text.find("  sasrec, 2 runs, 2 finished (seeds 42, 43):"), std::string::npos) << text;
  EXPECT_NE(text.find("  sasrec (patience=5), 2 runs, 2 finished (seeds 44, 45):"), std::string::npos) << text;
  // Stopped short by a patience of 10, a run is alike with the finished run of patience 10, not
  // with the one of patience 0 (which that patience might have stopped too): it joins no group
  // holding both.
  const std::string a47 = run("a47", "seed=47\npatience=10\n", 7, 0.58);
  text = train::compare_runs({a42, a43, a47}, {"NDCG@10"});
  EXPECT_EQ(text.find("  sasrec, 3 runs"), std::string::npos) << text;
  EXPECT_NE(text.find("  sasrec, 2 runs, 2 finished (seeds 42, 43):"), std::string::npos) << text;
  // Unfinished (not yet tested), a run's patience may still stop it: apart as well.
  const std::string a46 = run("a46", "seed=46\npatience=3\n", 10, -1);
  text = train::compare_runs({a42, a43, a46}, {"NDCG@10"});
  EXPECT_EQ(text.find("  sasrec, 3 runs"), std::string::npos) << text;
  EXPECT_NE(text.find("  sasrec, 2 runs, 2 finished (seeds 42, 43):"), std::string::npos) << text;
}

// A flag that a run's flags.txt lacks (the run predates it) is taken at its default: such runs
// group with runs that set the default and apart from runs that set another value, and the
// groups are named by it. Without the defaults it is compared only between runs that record it.
TEST(RunSummary, FlagsARunPredatesTakeTheirDefaults) {
  FakeRuns farm("seqrec-run-defaults");
  std::vector<std::string> dirs;
  for (const char* seed : {"42", "43"}) {
    const std::string s = std::string("seed=") + seed + "\n";
    dirs.push_back(farm.make(std::string("old") + seed, "model=linrec\nhidden=50\n" + s, 0.61, 0.59));
    dirs.push_back(farm.make(std::string("on") + seed, "model=linrec\nhidden=50\nlinrec_pad_keys=true\n" + s, 0.62, 0.595));
  }
  // flags.txt since 2026-12-06: a flagfile, --name=value under a comment; it groups with the older form.
  dirs.push_back(farm.make("off44", "# a comment = not a flag\n--model=linrec\n--hidden=50\n--linrec_pad_keys=false\n--seed=44\n",
                           0.6, 0.58));
  // A SASRec run is not labelled with LinRec's option (it does not read it).
  for (const char* seed : {"42", "43"})
    dirs.push_back(farm.make(std::string("sasrec") + seed, std::string("model=sasrec\nhidden=50\nseed=") + seed + "\n", 0.63, 0.6));
  const std::string text = train::compare_runs(dirs, {"NDCG@10"}, {{"linrec_pad_keys", "false"}, {"hidden", "64"}});
  EXPECT_NE(text.find("  linrec (linrec_pad_keys=false), 3 runs, 3 finished (seeds 42, 43, 44)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("  linrec (linrec_pad_keys=true), 2 runs, 2 finished (seeds 42, 43)"), std::string::npos) << text;
  EXPECT_NE(text.find("  linrec (linrec_pad_keys=true) minus linrec (linrec_pad_keys=false) (seeds 42, 43): valid "
                      "+0.0100 +- 0.0000"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  sasrec, 2 runs, 2 finished"), std::string::npos) << text;
  EXPECT_NE(text.find("  sasrec minus linrec (linrec_pad_keys=false) (seeds 42, 43)"), std::string::npos) << text;
  const std::string blind = train::compare_runs(dirs, {"NDCG@10"});
  // Without the defaults a flag a run does not record is not compared: the old runs join the
  // group of the runs that set it on (they are alike with each of its runs), and the run that set
  // it off stays apart from those.
  EXPECT_NE(blind.find("  linrec, 4 runs, 4 finished (seeds 42, 42, 43, 43)"), std::string::npos) << blind;
  EXPECT_EQ(blind.find("  sasrec minus linrec"), std::string::npos) << "seeds 42 and 43 twice in a group pair nothing";
}

}  // namespace
