// End-to-end: the seqrec executable on synthetic data — training, evaluation protocols,
// exact resume, and every bad input from the walking-skeleton issue (clear message,
// non-zero exit, nothing half-written, no hang).
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include <signal.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <torch/torch.h>

#include "io/remove_tree.h"
#include "tests/e2e/cli_harness.h"
#include "tests/test_files.h"
#include "train/checkpoint.h"

namespace {
namespace fs = std::filesystem;
using namespace seqrec::testing;

// Small but learnable: 300 users over 400 items.
const char* kTrainSmall =
    "--max_len 20 --hidden 16 --blocks 1 --heads 1 --batch_size 32 --threads 1 --log_every 1000 "
    "--eval_batch 64 ";

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(scratch_dir("cli"));
    auto r = run_seqrec("synth --out " + data() + " --users 300 --items 400 --events 9000 --seed 3 --shards 2 --progress=false");
    ASSERT_EQ(r.code, 0) << r.output;
  }
  static void TearDownTestSuite() {
    seqrec::io::remove_tree(*root_);
    delete root_;
  }
  static std::string data() { return *root_ + "/data"; }
  static std::string dir(const std::string& name) { return *root_ + "/" + name; }
  static std::string* root_;
};
std::string* Cli::root_ = nullptr;

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::map<std::string, at::Tensor> params_of(const std::string& checkpoint_dir) {
  auto b = seqrec::train::read_bundle_file(checkpoint_dir + "/shared.bin");
  std::map<std::string, at::Tensor> out;
  for (auto& [n, t] : b.tensors)
    if (n.rfind("param/", 0) == 0 || n.rfind("adam/", 0) == 0 || n.rfind("buffer/", 0) == 0) out[n] = t;
  return out;
}

// The newest (or the oldest kept) complete checkpoint of a run.
std::string newest_checkpoint(const std::string& run, bool oldest = false) {
  std::string pick;
  for (auto& e : fs::directory_iterator(run + "/checkpoints"))
    if (e.path().filename().string().rfind("step-", 0) == 0 && fs::exists(e.path() / "COMPLETE"))
      pick = pick.empty() ? e.path().string() : oldest ? std::min(pick, e.path().string()) : std::max(pick, e.path().string());
  return pick;
}

TEST_F(Cli, TrainsEvaluatesAndReportsProtocols) {
  const std::string run = dir("train");
  auto r = run_seqrec("train --data " + data() + " --out " + run + " " + kTrainSmall + "--epochs 3", 300);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "split=test")) << r.output;
  EXPECT_TRUE(contains(r.output, "tie=pessimistic"));
  EXPECT_TRUE(contains(r.output, "1 target + 100 uniform negatives not in the user's sequence"));
  EXPECT_TRUE(contains(r.output, "full ranking over all items"));
  // The closing line reports the process's peak resident memory (a LibTorch process holds
  // tens of MiB before it reads any data).
  std::smatch peak;
  ASSERT_TRUE(std::regex_search(r.output, peak, std::regex("peak RSS/rank=([0-9]+) MiB"))) << r.output;
  EXPECT_GT(std::stol(peak[1]), 20);
  // Tensors come from seqrec's caching host allocator by default (glibc's heap fragments
  // without bound under FLASH4Rec's mixture of experts: docs/benchmarks.md), named in the log
  // with what it did.
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\[setup\] allocator: seqrec caching host allocator)"))) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\[done\] host allocator: peak in use [0-9]+ MiB, cached [0-9]+ MiB, [0-9]+ maps, [0-9]+ unmaps, [0-9]+ reuses)"))) << r.output;
  auto lines = read_lines(run + "/metrics.jsonl");
  // 3 validations x (sampled + full) + 1 test x (sampled + full)
  ASSERT_EQ(lines.size(), 8u);
  for (auto& l : lines) {
    EXPECT_TRUE(contains(l, "\"dataset\":\"synth\"")) << l;
    EXPECT_TRUE(contains(l, "\"candidates\":")) << l;
    EXPECT_TRUE(contains(l, "\"NDCG@10\":")) << l;
    EXPECT_TRUE(contains(l, "\"epoch\":")) << l;
  }
  EXPECT_EQ(std::count_if(lines.begin(), lines.end(), [](auto& l) { return contains(l, "\"split\":\"test\""); }), 2);
  EXPECT_TRUE(fs::exists(run + "/flags.txt"));
  EXPECT_TRUE(fs::exists(run + "/train.log"));

  auto e = run_seqrec("eval --checkpoint " + run + "/best --data " + data() + " --split valid --threads 1");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_TRUE(contains(e.output, "split=valid")) << e.output;
  EXPECT_TRUE(contains(e.output, "epoch=3")) << "the checkpoint's epoch is printed: " << e.output;
  // Without --data, the dataset the checkpoint was trained on: named, and the same figures.
  auto own = run_seqrec("eval --checkpoint " + run + "/best --split valid --threads 1");
  ASSERT_EQ(own.code, 0) << own.output;
  EXPECT_TRUE(contains(own.output, "[eval] --data not given: the checkpoint's dataset, " + data())) << own.output;
  const std::regex result_line(R"(\[eval\] dataset=.* split=valid [^\n]*?(?= \([0-9.]+ s\)))");
  std::smatch with_data, without_data;
  ASSERT_TRUE(std::regex_search(e.output, with_data, result_line)) << e.output;
  ASSERT_TRUE(std::regex_search(own.output, without_data, result_line)) << own.output;
  EXPECT_EQ(with_data.str(), without_data.str());
  // The run directory itself is not a checkpoint: its two checkpoint folders are named.
  auto whole = run_seqrec("eval --checkpoint " + run + " --threads 1");
  EXPECT_EQ(whole.code, 1) << whole.output;
  EXPECT_TRUE(contains(whole.output, "'" + run + "' is a run directory: name its best/")) << whole.output;
  auto full = run_seqrec("eval --checkpoint " + run + "/best --data " + data() + " --eval_protocol full --exclude_history --threads 1");
  ASSERT_EQ(full.code, 0) << full.output;
  EXPECT_TRUE(contains(full.output, "history excluded")) << full.output;

  auto info = run_seqrec("info " + run);
  ASSERT_EQ(info.code, 0) << info.output;
  EXPECT_TRUE(contains(info.output, "model=sasrec")) << info.output;
  // A run directory's summary: the selection, the test evaluation with its protocols, the time.
  EXPECT_TRUE(contains(info.output, "status: finished")) << info.output;
  EXPECT_TRUE(std::regex_search(info.output, std::regex("selected on valid NDCG@10 under \"sampled: 1 target \\+ 100 uniform "
                                                        "negatives not in the user's sequence\": NDCG@10=[0-9.]+ at epoch [1-3]")))
      << info.output;
  EXPECT_TRUE(contains(info.output, "test (model selected on valid NDCG@10 at epoch")) << info.output;
  EXPECT_TRUE(contains(info.output, "\"full ranking over all items, history not excluded\" (tie=pessimistic")) << info.output;
  EXPECT_TRUE(contains(info.output, "s/epoch training")) << info.output;
  auto dinfo = run_seqrec("info " + data());
  ASSERT_EQ(dinfo.code, 0) << dinfo.output;
  EXPECT_TRUE(contains(dinfo.output, "300")) << dinfo.output;
  // A dataset's meta.h5 stands for its dataset; any other file is refused by name.
  EXPECT_EQ(run_seqrec("info " + data() + "/meta.h5").output, dinfo.output);
  auto file = run_seqrec("info " + run + "/train.log");
  EXPECT_EQ(file.code, 2) << file.output;
  EXPECT_TRUE(contains(file.output, "'" + run + "/train.log' is a file; give a dataset directory")) << file.output;
  // Several run directories side by side; the same run twice is a group of two runs alike but
  // for the seed, with no spread. A path that is not a run is named.
  auto both = run_seqrec("info " + run + " " + run + " --metrics NDCG@10,MRR");
  ASSERT_EQ(both.code, 0) << both.output;
  EXPECT_TRUE(contains(both.output, "[1] NDCG@10  [1] MRR")) << both.output;
  EXPECT_TRUE(std::regex_search(both.output, std::regex(R"(sasrec, 2 runs, 2 finished \(seeds [0-9]+, [0-9]+\): valid [0-9.]+ \+- 0\.0000;)")))
      << both.output;
  auto notrun = run_seqrec("info " + run + " " + data());
  EXPECT_NE(notrun.code, 0);
  EXPECT_TRUE(contains(notrun.output, "'" + data() + "' is not a run directory")) << notrun.output;
  // --curves adds the validation curves side by side (the same run twice differs by 0 at every
  // epoch), to one run's summary its curve; a dataset has none.
  auto curves = run_seqrec("info " + run + " " + run + " --curves");
  ASSERT_EQ(curves.code, 0) << curves.output;
  EXPECT_TRUE(contains(curves.output, "at every validated epoch (* each run's selected epoch so far")) << curves.output;
  EXPECT_TRUE(std::regex_search(curves.output, std::regex(R"(\n +1 +[0-9.]+[* ] +[0-9.]+[* ] +\+0\.0000\n)"))) << curves.output;
  auto one = run_seqrec("info " + run + " --curves");
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_TRUE(contains(one.output, "status: finished")) << one.output;
  EXPECT_TRUE(std::regex_search(one.output, std::regex(R"(\n +best +[0-9.]+ \([1-3]\)\n)"))) << one.output;
  auto nocurve = run_seqrec("info " + data() + " --curves");
  EXPECT_EQ(nocurve.code, 2) << nocurve.output;
  EXPECT_TRUE(contains(nocurve.output, "--curves applies to run directories")) << nocurve.output;
}

TEST_F(Cli, LearnsTheSyntheticStructure) {
  const std::string run = dir("learn");
  auto r = run_seqrec("train --data " + data() + " --out " + run + " " + kTrainSmall + "--epochs 15 --dropout 0.1 --lr 0.005",
                  600);
  ASSERT_EQ(r.code, 0) << r.output;
  // Random ranking among 101 candidates gives HR@10 ~ 0.099; a sequence model must do far better.
  auto lines = read_lines(run + "/metrics.jsonl");
  double test_hr = -1;
  for (auto& l : lines)
    if (contains(l, "\"split\":\"test\"") && contains(l, "sampled100")) {
      auto p = l.find("\"HR@10\":");
      test_hr = std::stod(l.substr(p + 8));
    }
  EXPECT_GT(test_hr, 0.3) << r.output;
}

// `common` trained for `total` steps into `whole`, and for `first` steps then resumed
// (`--resume auto`) up to `total` into `split`; the callers compare the two runs' checkpoints.
void train_whole_and_resumed(const std::string& common, const std::string& whole, const std::string& split,
                             int first, int total) {
  auto w = run_seqrec(common + "--out " + whole + " --max_steps " + std::to_string(total), 300);
  ASSERT_EQ(w.code, 0) << w.output;
  auto a = run_seqrec(common + "--out " + split + " --max_steps " + std::to_string(first), 300);
  ASSERT_EQ(a.code, 0) << a.output;
  auto b = run_seqrec(common + "--out " + split + " --max_steps " + std::to_string(total) + " --resume auto", 300);
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_TRUE(contains(b.output, "[resume]")) << b.output;
  // The resumed sitting's own time per epoch beside the whole run's, over its own steps.
  EXPECT_TRUE(contains(b.output, "; this sitting ")) << b.output;
  EXPECT_TRUE(contains(b.output, " s/epoch over " + std::to_string(total - first) + " steps")) << b.output;
  EXPECT_FALSE(contains(w.output, "; this sitting ")) << w.output;
}

// The same, and the two end with equal parameters.
void expect_resume_exact(const std::string& common, const std::string& whole, const std::string& split, int first,
                         int total) {
  ASSERT_NO_FATAL_FAILURE(train_whole_and_resumed(common, whole, split, first, total));
  auto pa = params_of(newest_checkpoint(whole)), pb = params_of(newest_checkpoint(split));
  ASSERT_EQ(pa.size(), pb.size());
  ASSERT_FALSE(pa.empty());
  for (auto& [n, t] : pa) EXPECT_TRUE(torch::equal(t, pb.at(n))) << n << " differs after resume";
}

// The steps per epoch a train run's setup line reports (-1 if none).
int steps_per_epoch(const std::string& output) {
  const auto p = output.find("steps/epoch=");
  return p == std::string::npos ? -1 : std::stoi(output.substr(p + 12));
}

TEST_F(Cli, ResumeIsExact) {
  const std::string a = dir("resume-a"), b = dir("resume-b");
  const std::string common = "train --data " + data() + " " + kTrainSmall + "--epochs 5 --final_test=false ";
  // 14 steps uninterrupted (crosses an epoch boundary: 300 users / 32 = 10 steps per epoch).
  ASSERT_NO_FATAL_FAILURE(expect_resume_exact(common, a, b, 6, 14));
}

// --weight_decay_mode decoupled reaches the optimizer: its weight matrices end smaller than an
// undecayed run's, and apart from the L2 run's at the same rate; flags.txt records the mode.
TEST_F(Cli, DecoupledWeightDecayShrinksTheMatrices) {
  const std::string common = "train --data " + data() + " " + kTrainSmall + "--epochs 1 --final_test=false ";
  const std::string none = dir("wd-none"), l2 = dir("wd-l2"), decoupled = dir("wd-decoupled");
  for (const auto& [run, flags] : std::vector<std::pair<std::string, std::string>>{
           {none, ""}, {l2, "--weight_decay 20"}, {decoupled, "--weight_decay 20 --weight_decay_mode decoupled"}}) {
    auto r = run_seqrec(common + "--out " + run + " " + flags, 300);
    ASSERT_EQ(r.code, 0) << r.output;
  }
  EXPECT_TRUE(contains(read_file(decoupled + "/flags.txt"), "--weight_decay_mode=decoupled\n"));
  const auto pn = params_of(newest_checkpoint(none)), pl = params_of(newest_checkpoint(l2)),
             pd = params_of(newest_checkpoint(decoupled));
  int matrices = 0;
  for (const auto& [name, t] : pd) {
    if (name.rfind("param/", 0) != 0 || t.dim() < 2) continue;
    ++matrices;
    // 10 steps at lr 1e-3 x 20: each matrix shrinks by 0.98^10 = 0.82 apart from its updates.
    EXPECT_LT(t.norm().item<double>(), 0.9 * pn.at(name).norm().item<double>()) << name;
    EXPECT_FALSE(torch::allclose(t, pl.at(name))) << name << ": decoupled decay updated as L2 did";
  }
  EXPECT_GT(matrices, 3);
}

// --label_smoothing reaches the softmax loss: the run says so and records it, and its weights
// part from an unsmoothed run's of the same seed (the smoothing's arithmetic is
// SoftmaxLoss.LabelSmoothingGivesTheSmoothedCrossEntropy's).
TEST_F(Cli, LabelSmoothingReachesTheSoftmaxLoss) {
  const std::string common = "train --data " + data() + " " + kTrainSmall + "--epochs 1 --final_test=false --loss ce ";
  const std::string plain = dir("ls-none"), smoothed = dir("ls-0.2");
  auto r = run_seqrec(common + "--out " + plain, 300);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "label smoothing")) << r.output;
  r = run_seqrec(common + "--out " + smoothed + " --label_smoothing 0.2", 300);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[setup] loss: softmax over all items with label smoothing 0.200")) << r.output;
  EXPECT_TRUE(contains(read_file(smoothed + "/flags.txt"), "--label_smoothing=0.2"));
  const auto pp = params_of(newest_checkpoint(plain)), ps = params_of(newest_checkpoint(smoothed));
  int differ = 0;
  for (const auto& [name, t] : ps)
    if (name.rfind("param/", 0) == 0) differ += !torch::allclose(t, pp.at(name), 1e-6, 1e-7);
  EXPECT_GT(differ, 3) << "the smoothed run's weights should part from the plain run's";
}

// --loss sampled: the model learns the structure, and a resumed run draws what the whole one drew.
TEST_F(Cli, SampledSoftmaxLearnsAndResumesExactly) {
  const std::string run = dir("sampled-learn");
  auto r = run_seqrec("train --data " + data() + " --out " + run + " " + kTrainSmall +
                          "--epochs 15 --dropout 0.1 --lr 0.005 --loss sampled --loss_negatives 50 --loss_sampler popularity "
                          "--eval_every 15",
                      600);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[setup] loss: sampled softmax over the target and 50 items per step, drawn in "
                                 "proportion to training count + 1")) << r.output;
  double test_hr = -1;
  for (auto& l : read_lines(run + "/metrics.jsonl"))
    if (contains(l, "\"split\":\"test\"") && contains(l, "sampled100")) test_hr = std::stod(l.substr(l.find("\"HR@10\":") + 8));
  EXPECT_GT(test_hr, 0.3) << r.output;  // random: ~0.099, as in LearnsTheSyntheticStructure
  const std::string common = "train --data " + data() + " " + kTrainSmall +
                             "--epochs 5 --final_test=false --loss sampled --loss_negatives 30 ";
  ASSERT_NO_FATAL_FAILURE(expect_resume_exact(common, dir("sampled-a"), dir("sampled-b"), 6, 14));
}

// LISA's EMA codebooks are buffers: saved, restored, and continued exactly.
TEST_F(Cli, ResumeContinuesTheEmaCodebooksExactly) {
  const std::string a = dir("ema-a"), b = dir("ema-b");
  const std::string common = "train --data " + data() + " " + kTrainSmall +
                             "--epochs 5 --final_test=false --model lisa --codebook_update ema --codebooks 2 "
                             "--codewords 8 --norm_first=false --ema_decay 0.9 ";
  ASSERT_NO_FATAL_FAILURE(train_whole_and_resumed(common, a, b, 5, 12));
  auto pa = params_of(newest_checkpoint(a)), pb = params_of(newest_checkpoint(b));
  ASSERT_EQ(pa.size(), pb.size());
  int codebooks = 0;
  for (auto& [n, t] : pa) {
    EXPECT_TRUE(torch::equal(t, pb.at(n))) << n << " differs after resume";
    codebooks += n.find("buffer/") == 0 && n.find("codebooks") != std::string::npos;
  }
  EXPECT_EQ(codebooks, 1) << "the EMA codebooks must be checkpointed";
}

// Routing attention's k-means centroids are EMA buffers too: saved, restored, continued exactly.
TEST_F(Cli, ResumeContinuesTheRoutingCentroidsExactly) {
  const std::string a = dir("routing-a"), b = dir("routing-b");
  const std::string common = "train --data " + data() + " " + kTrainSmall +
                             "--epochs 5 --final_test=false --model routing --blocks 2 --heads 2 --routing_clusters 3 "
                             "--routing_decay 0.8 ";
  ASSERT_NO_FATAL_FAILURE(train_whole_and_resumed(common, a, b, 5, 12));
  auto pa = params_of(newest_checkpoint(a)), pb = params_of(newest_checkpoint(b)),
       start = params_of(newest_checkpoint(b, /*oldest=*/true));
  ASSERT_EQ(pa.size(), pb.size());
  int centroids = 0;
  for (auto& [n, t] : pa) {
    EXPECT_TRUE(torch::equal(t, pb.at(n))) << n << " differs after resume";
    if (n.find("buffer/") == 0 && n.find("centroids") != std::string::npos) {
      ++centroids;
      EXPECT_FALSE(torch::equal(t, start.at(n))) << n << " did not move between steps 5 and 12";
    }
  }
  EXPECT_EQ(centroids, 2) << "each block's centroids must be checkpointed";
}

// --train_windows: more examples per epoch than users, resumed exactly, and a checkpoint
// resumed with the other setting is refused by name (its cursor indexes other examples).
TEST_F(Cli, TrainWindowsResumeExactlyAndMustMatch) {
  const std::string a = dir("windows-a"), b = dir("windows-b");
  const std::string common = "train --data " + data() + " " + kTrainSmall +
                             "--epochs 5 --final_test=false --max_len 6 --train_windows ";
  ASSERT_NO_FATAL_FAILURE(expect_resume_exact(common, a, b, 5, 12));
  auto w = run_seqrec("train --data " + data() + " " + kTrainSmall + "--max_len 6 --train_windows --max_steps 1 "
                      "--final_test=false --out " + dir("windows-c"), 300);
  auto n = run_seqrec("train --data " + data() + " " + kTrainSmall + "--max_len 6 --max_steps 1 "
                      "--final_test=false --out " + dir("windows-d"), 300);
  ASSERT_EQ(w.code, 0) << w.output;
  EXPECT_TRUE(contains(w.output, "examples=windows of max_len")) << w.output;
  EXPECT_GT(steps_per_epoch(w.output), steps_per_epoch(n.output)) << w.output << n.output;
  auto r = run_seqrec("train --data " + data() + " " + kTrainSmall + "--epochs 5 --final_test=false --max_len 6 "
                      "--max_steps 14 --resume auto --out " + b, 300);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "without --train_windows") || contains(r.output, "with --train_windows")) << r.output;
}

// A decaying learning rate: logged, followed (the run ends elsewhere than a constant rate's),
// continued exactly on resume, and a resume whose flags plan another schedule (a raised
// --epochs) is refused by name rather than jumping the rate.
TEST_F(Cli, LrScheduleDecaysResumesExactlyAndMustMatch) {
  const std::string a = dir("cosine-a"), b = dir("cosine-b"), c = dir("cosine-constant");
  const std::string common = "train --data " + data() + " " + kTrainSmall + "--epochs 2 --final_test=false ";
  const std::string cosine = common + "--lr_schedule cosine --lr_final_ratio 0.1 --lr 0.01 ";
  ASSERT_NO_FATAL_FAILURE(expect_resume_exact(cosine, a, b, 6, 14));
  EXPECT_TRUE(contains(read_file(a + "/train.log"), "[setup] learning rate: cosine 0.01 -> 0.001 over steps 0-20"))
      << read_file(a + "/train.log");
  auto k = run_seqrec(common + "--lr 0.01 --max_steps 14 --out " + c, 300);
  ASSERT_EQ(k.code, 0) << k.output;
  EXPECT_TRUE(contains(k.output, "[setup] learning rate: constant 0.01")) << k.output;
  auto pa = params_of(newest_checkpoint(a)), pc = params_of(newest_checkpoint(c));
  int differ = 0;
  for (auto& [n, t] : pa) differ += n.rfind("param/", 0) == 0 && !torch::equal(t, pc.at(n));
  EXPECT_GT(differ, 0) << "the cosine run trained exactly as the constant one";
  auto r = run_seqrec(cosine + "--epochs 3 --max_steps 16 --resume auto --out " + b, 300);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "was trained with the learning-rate schedule 'cosine 0.01 -> 0.001 over steps 0-20'"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "this run's flags give 'cosine 0.01 -> 0.001 over steps 0-30'")) << r.output;
  // The constant run (stopped at step 14) goes on under a decay that begins at or after its step,
  // not under one that began before it (the rate would jump).
  const std::string anneal = common + "--lr 0.01 --lr_schedule linear --resume auto --out " + c;
  auto early = run_seqrec(anneal + " --lr_decay_from_epoch 1 --epochs 4", 300);
  EXPECT_NE(early.code, 0) << early.output;
  EXPECT_TRUE(contains(early.output, "or with a decay that begins at or after its step 14 (--lr_decay_from_epoch)"))
      << early.output;
  auto late = run_seqrec(anneal + " --lr_decay_from_epoch 2 --epochs 4", 300);
  ASSERT_EQ(late.code, 0) << late.output;
  EXPECT_TRUE(contains(late.output, "[setup] learning rate: linear 0.01 -> 0 over steps 20-40")) << late.output;
  // A run planned with a decay that begins past its end (a config's anneal under a shorter
  // --epochs) trains at the constant rate, says so, and goes on under the decay later.
  const std::string d = dir("anneal-later");
  const std::string planned = common + "--lr 0.01 --lr_schedule linear --lr_decay_from_epoch 2 --out " + d;
  auto first = run_seqrec(planned + " --epochs 1", 300);
  ASSERT_EQ(first.code, 0) << first.output;
  EXPECT_TRUE(contains(first.output, "[setup] learning rate: constant 0.01 (the linear decay planned from step 20 "
                                     "begins at or after the run's end, step 10)"))
      << first.output;
  auto then = run_seqrec(planned + " --epochs 4 --resume auto", 300);
  ASSERT_EQ(then.code, 0) << then.output;
  EXPECT_TRUE(contains(then.output, "[setup] learning rate: linear 0.01 -> 0 over steps 20-40")) << then.output;
  // A run whose planned decay has not begun (stopped at step 14 of a decay from step 30) may be
  // annealed earlier than planned, from a step at or after its own; once its decay has begun,
  // another plan is refused.
  const std::string e = dir("anneal-earlier");
  const std::string late_plan = common + "--lr 0.01 --lr_schedule linear --out " + e;
  auto stopped = run_seqrec(late_plan + " --lr_decay_from_epoch 3 --epochs 4 --max_steps 14", 300);
  ASSERT_EQ(stopped.code, 0) << stopped.output;
  EXPECT_TRUE(contains(stopped.output, "[setup] learning rate: linear 0.01 -> 0 over steps 30-40")) << stopped.output;
  auto sooner = run_seqrec(late_plan + " --lr_decay_from_epoch 2 --epochs 3 --resume auto", 300);
  ASSERT_EQ(sooner.code, 0) << sooner.output;
  EXPECT_TRUE(contains(sooner.output, "[setup] learning rate: linear 0.01 -> 0 over steps 20-30")) << sooner.output;
  auto replan = run_seqrec(late_plan + " --lr_decay_from_epoch 3 --epochs 5 --resume auto", 300);
  EXPECT_NE(replan.code, 0) << replan.output;
  EXPECT_TRUE(contains(replan.output, "was trained with the learning-rate schedule 'linear 0.01 -> 0 over steps 20-30'"))
      << replan.output;
}

// --train_prefixes with the last-slot objective (RecBole's and the released LinRec code's
// training): every prefix an example, more steps per epoch than windows give, resumed exactly,
// validated and tested; a checkpoint resumed without the flag is refused by name; the last
// block trains on the last slot alone.
TEST_F(Cli, TrainPrefixesWithTheLastObjective) {
  const std::string a = dir("prefixes-a"), b = dir("prefixes-b");
  const std::string common = "train --data " + data() + " " + kTrainSmall +
                             "--model linrec --objective last --epochs 5 --final_test=false --max_len 6 --train_prefixes ";
  ASSERT_NO_FATAL_FAILURE(expect_resume_exact(common, a, b, 5, 12));
  auto p = run_seqrec("train --data " + data() + " " + kTrainSmall + "--model linrec --objective last --max_len 6 "
                      "--train_prefixes --epochs 1 --out " + dir("prefixes-c"), 300);
  auto w = run_seqrec("train --data " + data() + " " + kTrainSmall + "--max_len 6 --train_windows --max_steps 1 "
                      "--final_test=false --out " + dir("prefixes-d"), 300);
  ASSERT_EQ(p.code, 0) << p.output;
  ASSERT_EQ(w.code, 0) << w.output;
  EXPECT_TRUE(contains(p.output, "objective=last attention=bidirectional")) << p.output;
  EXPECT_TRUE(contains(p.output, "examples=every prefix")) << p.output;
  EXPECT_TRUE(contains(p.output, "split=valid")) << p.output;
  EXPECT_TRUE(contains(p.output, "split=test")) << p.output;
  EXPECT_GT(steps_per_epoch(p.output), steps_per_epoch(w.output)) << p.output << w.output;
  auto r = run_seqrec("train --data " + data() + " " + kTrainSmall + "--model linrec --objective last --epochs 5 "
                      "--final_test=false --max_len 6 --max_steps 14 --resume auto --out " + b, 300);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "with --train_prefixes")) << r.output;
  // RecBole's SASRec: the same examples with causal attention, open to every model that way.
  auto c = run_seqrec("train --data " + data() + " " + kTrainSmall + "--model lisa --codewords 8 --objective last "
                      "--attention_mask causal --max_len 6 --train_prefixes --max_steps 3 --final_test=false --out " +
                      dir("prefixes-e"), 300);
  ASSERT_EQ(c.code, 0) << c.output;
  EXPECT_TRUE(contains(c.output, "objective=last attention=causal")) << c.output;
  // Training encodes the last slot alone: in two blocks, the first runs LinRec's packed op over
  // every slot, the last its one-query entry (no slot but the last is scored).
  const std::string prof = dir("prefixes-profile");
  auto f = run_seqrec("train --data " + data() + " " + kTrainSmall + "--model linrec --objective last --blocks 2 "
                      "--max_len 6 --train_prefixes --max_steps 3 --profile_steps 2 --profile_after 1 "
                      "--final_test=false --out " + prof, 300);
  ASSERT_EQ(f.code, 0) << f.output;
  std::string table;
  for (const auto& line : read_lines(prof + "/profile-rank0.txt")) table += line + "\n";
  EXPECT_TRUE(contains(table, "LinrecGlobalPaperPacked")) << table;
  EXPECT_TRUE(contains(table, "LinrecGlobalPaperLast")) << table;
}

TEST_F(Cli, LengthGroupsChangeTheWorkNotTheResult) {
  // Dropout off and Adam eps 1 (updates smooth in the gradient): slicing a batch by length
  // only reorders fp32 sums, ~1e-7 relative; a dropped or mis-aligned row would move
  // parameters by far more than 1e-6. FLASH4Rec (its mixture of experts runs the batch whole,
  // so only its gated attention slices it) without Top-K dropout, whose random bits are drawn
  // per slice.
  // The slices' targets are scored in one loss per batch: under --loss ce and sampled too.
  for (const std::string& model : {std::string(), std::string("--loss ce "), std::string("--loss sampled --loss_negatives 60 "),
                                   std::string("--model flash4rec --flash_user zero --moe_experts 2 --topk_dropout 0 ")}) {
    const std::string common = "train --data " + data() + " " + kTrainSmall + model +
                               "--dropout 0 --adam_eps 1 --max_steps 8 --final_test=false --epochs 5 ";
    const std::string tag = model.empty() ? "" : model.rfind("--loss ", 0) == 0 ? "-" + model.substr(7, 2) : "-flash";
    const std::string one = dir("groups1" + tag), eight = dir("groups8" + tag);
    auto r1 = run_seqrec(common + "--out " + one + " --length_groups 1", 300);
    ASSERT_EQ(r1.code, 0) << r1.output;
    EXPECT_TRUE(contains(r1.output, " length_groups=1")) << r1.output;
    auto r8 = run_seqrec(common + "--out " + eight, 300);  // the CPU's default: 8
    ASSERT_EQ(r8.code, 0) << r8.output;
    EXPECT_TRUE(contains(r8.output, " length_groups=8")) << r8.output;
    auto a = params_of(newest_checkpoint(one)), b = params_of(newest_checkpoint(eight));
    double worst = 0;
    for (auto& [n, t] : a)
      if (n.rfind("param/", 0) == 0) worst = std::max(worst, (t - b.at(n)).abs().max().item<double>());
    EXPECT_LT(worst, 1e-6) << model;
    EXPECT_GT(a.size(), 0u);
  }
}

// The allocator serves memory, never values: FLASH4Rec (its mixture of experts frees and
// reallocates blocks of changing sizes every step, the case the caching allocator exists for)
// ends bit-identical under both, and the caching one did reuse blocks.
TEST_F(Cli, HostAllocatorChangesMemoryNotTheResult) {
  const std::string common = "train --data " + data() + " --model flash4rec --flash_user zero --moe_experts 4 " +
                             "--max_len 40 --hidden 64 --blocks 1 --batch_size 64 --threads 1 --log_every 1000 " +
                             "--eval_batch 64 --max_steps 12 --final_test=false --epochs 5 --length_groups 1 ";
  const std::string sys = dir("alloc-system"), cache = dir("alloc-caching");
  auto a = run_seqrec(common + "--out " + sys + " --host_allocator system", 300);
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_TRUE(contains(a.output, "[setup] allocator: glibc malloc")) << a.output;
  EXPECT_FALSE(contains(a.output, "[done] host allocator")) << a.output;
  auto b = run_seqrec(common + "--out " + cache + " --host_allocator caching --log_every 0", 300);
  ASSERT_EQ(b.code, 0) << b.output;
  std::smatch m;
  // Progress lines carry the resident memory, so that growth shows while a run goes on.
  ASSERT_TRUE(std::regex_search(b.output, m, std::regex(R"(\[train\] epoch .* step 4 .* RSS/rank ([0-9]+) MiB)"))) << b.output;
  EXPECT_GT(std::stol(m[1]), 20);
  ASSERT_TRUE(std::regex_search(b.output, m, std::regex(R"(\[done\] host allocator: .* ([0-9]+) reuses)"))) << b.output;
  EXPECT_GT(std::stol(m[1]), 0) << b.output;
  auto pa = params_of(newest_checkpoint(sys)), pb = params_of(newest_checkpoint(cache));
  ASSERT_FALSE(pa.empty());
  ASSERT_EQ(pa.size(), pb.size());
  for (auto& [n, t] : pa) EXPECT_TRUE(torch::equal(t, pb.at(n))) << n << " differs between allocators";
}

// Keeping the softmax probabilities for the backward (--softmax_keep_mib) changes the work,
// never the values: SASRec under --loss ce in length-sorted slices, and FLASH4Rec's whole-batch
// forward, end bit-identical with the probabilities kept and recomputed.
TEST_F(Cli, SoftmaxKeepChangesTheWorkNotTheResult) {
  const std::string common = "train --data " + data() + " --loss ce --max_len 40 --hidden 32 --blocks 1 --batch_size 64 " +
                             "--threads 1 --log_every 1000 --max_steps 8 --final_test=false --epochs 5 ";
  for (const std::string model : {"--model sasrec --length_groups 4", "--model flash4rec --flash_user zero --moe_experts 2"}) {
    std::map<std::string, at::Tensor> params[2];
    for (int keep = 0; keep < 2; ++keep) {
      const std::string out = dir(std::string("softmax-keep") + (keep ? "1-" : "0-") + model.substr(8, 5));
      auto r = run_seqrec(common + model + " --out " + out + " --softmax_keep_mib " + (keep ? "256" : "0"), 300);
      ASSERT_EQ(r.code, 0) << r.output;
      params[keep] = params_of(newest_checkpoint(out));
    }
    ASSERT_FALSE(params[0].empty());
    ASSERT_EQ(params[0].size(), params[1].size());
    for (auto& [n, t] : params[0]) EXPECT_TRUE(torch::equal(t, params[1].at(n))) << model << ": " << n << " differs";
  }
}

// A second run into a directory that holds checkpoints is refused, and touches nothing there:
// the run's flags.txt and train.log stay as they were.
TEST_F(Cli, RefusesToOverwriteARunWithoutResume) {
  const std::string run = dir("twice");
  const std::string cmd = "train --data " + data() + " --out " + run + " " + kTrainSmall + "--max_steps 2 --final_test=false";
  ASSERT_EQ(run_seqrec(cmd).code, 0);
  const auto read = [&](const std::string& name) { return read_file(run + "/" + name); };
  const std::string flags = read("flags.txt"), log = read("train.log");
  ASSERT_TRUE(contains(flags, "hidden=16")) << flags;
  auto r = run_seqrec(cmd + " --hidden 24");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "--resume auto")) << r.output;
  EXPECT_EQ(read("flags.txt"), flags) << "the refused invocation rewrote the run's flags";
  EXPECT_EQ(read("train.log"), log) << "the refused invocation wrote to the run's log";
  auto info = run_seqrec("info " + run);
  EXPECT_EQ(info.code, 0) << info.output;
  EXPECT_FALSE(contains(info.output, "failed")) << info.output;
}

// One trainer per run directory: while another process holds <out>/.lock, a second `train`
// (a resume started before the first trainer has finished its stop checkpoint, say) is refused,
// naming the directory and the holder's pid, and touches nothing; once the holder lets go, the
// same command runs.
TEST_F(Cli, ARunDirectoryInUseIsRefused) {
  const std::string run = dir("busy");
  const std::string cmd = "train --data " + data() + " --out " + run + " " + kTrainSmall + "--max_steps 2 --final_test=false";
  ASSERT_EQ(run_seqrec(cmd).code, 0);
  const auto read = [&](const std::string& name) { return read_file(run + "/" + name); };
  const std::string log = read("train.log");
  // Stand in for a live trainer: take the lock the way seqrec does, with a pid of our own.
  const int fd = ::open((run + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  ASSERT_EQ(::ftruncate(fd, 0), 0);
  ASSERT_EQ(::pwrite(fd, "424242\n", 7, 0), 7);
  auto r = run_seqrec(cmd + " --max_steps 4 --resume auto");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "run directory " + run + " is in use by another seqrec train (pid 424242)")) << r.output;
  EXPECT_EQ(read("train.log"), log) << "the refused invocation wrote to the run's log";
  EXPECT_EQ(newest_checkpoint(run), run + "/checkpoints/step-000000000002");
  ::close(fd);
  r = run_seqrec(cmd + " --max_steps 4 --resume auto");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(newest_checkpoint(run), run + "/checkpoints/step-000000000004");
}

// A run that cannot start on its dataset fails before it writes anything: a missing dataset, or
// an evaluation protocol the dataset cannot serve (found before the first step, not at the
// first validation).
TEST_F(Cli, ARunThatCannotStartLeavesNothingBehind) {
  const std::string run = dir("never");
  auto r = run_seqrec("train --data " + data() + " --out " + run + " " + kTrainSmall + "--max_steps 2 --eval_negatives 500");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "fewer negatives (500) than items (400)")) << r.output;
  EXPECT_FALSE(fs::exists(run)) << "a run directory was left behind";
  r = run_seqrec("train --data " + dir("no-such-data") + " --out " + run + " " + kTrainSmall + "--max_steps 2");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "no-such-data")) << r.output;
  EXPECT_FALSE(fs::exists(run)) << "a run directory was left behind";
  // A run directory that cannot be created (its parent is a plain file) is named.
  const std::string file = dir("plain-file");
  std::ofstream(file) << "not a directory\n";
  r = run_seqrec("train --data " + data() + " --out " + file + "/run " + kTrainSmall + "--max_steps 2");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "cannot create the run directory " + file + "/run")) << r.output;
}

// A sitting that ends on an error says so in the run's log (every line of the message), and
// `seqrec info` reports the run as failed with that error (exit 0: the directory was read),
// until a later sitting goes on.
TEST_F(Cli, AFailedSittingSaysWhyInTheLogAndInfo) {
  const std::string run = dir("failed");
  const std::string cmd = "train --data " + data() + " --out " + run + " " + kTrainSmall;
  ASSERT_EQ(run_seqrec(cmd + "--max_steps 2 --final_test=false").code, 0);
  auto r = run_seqrec(cmd + "--max_steps 4 --final_test=false --hidden 24 --resume auto");
  ASSERT_NE(r.code, 0) << r.output;
  const auto log = read_lines(run + "/train.log");
  ASSERT_GE(log.size(), 2u);
  EXPECT_TRUE(contains(log[log.size() - 2], "[error] ") && contains(log[log.size() - 2], "different model configuration"))
      << log[log.size() - 2];
  EXPECT_TRUE(contains(log.back(), "[error] ") && contains(log.back(), "hidden: 16 vs 24")) << log.back();
  auto info = run_seqrec("info " + run);
  EXPECT_EQ(info.code, 0) << info.output;
  EXPECT_TRUE(std::regex_search(info.output, std::regex("status: failed \\(.*different model configuration.* hidden: 16 vs 24\\)")))
      << info.output;
  ASSERT_EQ(run_seqrec(cmd + "--epochs 1 --resume auto").code, 0);
  info = run_seqrec("info " + run);
  EXPECT_TRUE(contains(info.output, "status: finished")) << info.output;
}

TEST_F(Cli, BadCheckpointsAreRejectedAndEarlierOnesSurvive) {
  const std::string run = dir("badckpt");
  const std::string cmd = "train --data " + data() + " --out " + run + " " + kTrainSmall + "--final_test=false ";
  ASSERT_EQ(run_seqrec(cmd + "--max_steps 3").code, 0);
  ASSERT_EQ(run_seqrec(cmd + "--max_steps 5 --resume auto").code, 0);
  const std::string newest = newest_checkpoint(run);

  // A different model configuration.
  auto r = run_seqrec("train --data " + data() + " --out " + run + " " + kTrainSmall +
                  "--final_test=false --max_steps 8 --resume auto --hidden 24");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "different model configuration")) << r.output;
  EXPECT_TRUE(contains(r.output, "hidden: 16 vs 24")) << r.output;

  // A flipped byte: the checksum names the file.
  {
    std::fstream f(newest + "/shared.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    char c;
    f.read(&c, 1);
    f.seekp(200);
    c ^= 0x10;
    f.write(&c, 1);
  }
  r = run_seqrec("train --data " + data() + " --out " + run + " " + kTrainSmall + "--final_test=false --max_steps 8 --resume " + newest);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "shared.bin")) << r.output;
  // Truncated: same, and `auto` must not pick a corrupt checkpoint silently either.
  fs::resize_file(newest + "/shared.bin", 100);
  r = run_seqrec("eval --checkpoint " + newest + " --data " + data());
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "shared.bin")) << r.output;
}

// A checkpoint evaluated without --data whose training dataset is no longer where its run
// named it: refused naming the path, with --data as the way out.
TEST_F(Cli, EvalWithoutDataNamesAMissingTrainingDataset) {
  const std::string gone = dir("gone-data"), run = dir("gone-run");
  ASSERT_EQ(run_seqrec("synth --out " + gone + " --users 60 --items 400 --events 900 --seed 5 --progress=false").code, 0);
  auto r = run_seqrec("train --data " + gone + " --out " + run + " " + kTrainSmall + "--final_test=false --max_steps 2");
  ASSERT_EQ(r.code, 0) << r.output;
  seqrec::io::remove_tree(gone);
  r = run_seqrec("eval --checkpoint " + run + "/best");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "'" + gone + "', is not a directory here")) << r.output;
  EXPECT_TRUE(contains(r.output, "pass --data")) << r.output;
}

TEST_F(Cli, KillDuringCheckpointWriteKeepsThePreviousOne) {
  const std::string run = dir("kill9");
  const std::string cmd = seqrec_bin() + " train --data " + data() + " --out " + run + " " + kTrainSmall +
                          "--final_test=false --checkpoint_every 1 --keep_checkpoints 2 --hidden 64 --epochs 1000";
  // Several kills at different moments; after each, resume must work from a complete checkpoint.
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string resume = attempt == 0 ? "" : " --resume auto";
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", ("exec " + cmd + resume + " > /dev/null 2>&1").c_str(), (char*)nullptr);
      _exit(127);
    }
    // Wait until it has written checkpoints, then kill it at an arbitrary point.
    for (int i = 0; i < 600 && (!fs::exists(run + "/checkpoints") || newest_checkpoint(run).empty()); ++i)
      usleep(100 * 1000);
    usleep((150 + 170 * attempt) * 1000);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_FALSE(newest_checkpoint(run).empty());
    auto info = run_seqrec("info " + newest_checkpoint(run));
    EXPECT_EQ(info.code, 0) << info.output;
  }
  auto r = run_seqrec("train --data " + data() + " --out " + run + " " + kTrainSmall +
                      "--final_test=false --checkpoint_every 1 --keep_checkpoints 2 --hidden 64 --epochs 1000 --resume auto --max_steps 1",
                  120);
  // max_steps 1 is already reached: it resumes, stops at once and exits cleanly.
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[resume]")) << r.output;
}

// Every registered model trains, selects and tests through the same CLI path.
TEST_F(Cli, EveryModelTrainsAndTests) {
  for (std::string m : {"linrec --linrec_norm code", "lisa --lisa_variant mini --codewords 4 --target_codewords 8",
                        "lisa --lisa_variant soft --codewords 4 --lisa_commitment 0.01", "lightsans --interests 4",
                        "lightsans --interests 4 --lightsans_position absolute",
                        "routing --heads 2 --routing_clusters 3 --routing_window 4",
                        "sasrec --objective cloze --mask_prob 0.3",
                        "flash4rec --flash_user embedding --moe_experts 3 --moe_top_k 2 --topk_dropout_k 3",
                        "flash4rec --flash_attention cosine --flash_user zero --objective cloze --capacity_factor 0.5",
                        "flash4rec --flash_unit mhsa --moe_experts 0 --flash_user none"}) {
    const std::string run = dir("model-" + std::to_string(std::hash<std::string>{}(m)));
    auto r = run_seqrec("train --data " + data() + " --out " + run + " " + kTrainSmall + "--epochs 2 --model " + m, 120);
    EXPECT_EQ(r.code, 0) << m << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "split=test")) << m << "\n" << r.output;
    auto info = run_seqrec("info --checkpoint " + run + "/best");
    EXPECT_TRUE(contains(info.output, "model=" + m.substr(0, m.find(' ')))) << info.output;
    // Every model recommends through the same path (LISA's quantised targets, the cloze [mask]
    // slot, FLASH4Rec's user input): three items for each of two users, none from their histories.
    auto rec = run_seqrec("recommend --checkpoint " + run + "/best --user_ids 5,17 --top_k 3 --exclude_history --threads 1");
    EXPECT_EQ(rec.code, 0) << m << "\n" << rec.output;
    EXPECT_TRUE(std::regex_search(rec.output, std::regex("\nuser\trank\titem\tscore\n5\t1\t[0-9]+\t[^\n]+\n5\t2\t[^\n]+\n"
                                                         "5\t3\t[^\n]+\n17\t1\t[^\n]+\n17\t2\t[^\n]+\n17\t3\t")))
        << m << "\n" << rec.output;
  }
}

// A device this process cannot use (no CUDA here, or too high an index on a GPU machine) is
// named before the run directory exists; so is an evaluation asked of one.
TEST_F(Cli, ADeviceThisMachineLacksIsRefusedBeforeAnythingIsWritten) {
  const std::string run = dir("no-device");
  auto r = run_seqrec("train --data " + data() + " --out " + run + " " + kTrainSmall + "--max_steps 2 --device cuda:99");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.code, 124) << "timed out";
  EXPECT_TRUE(std::regex_search(r.output, std::regex("--device cuda:99: (no CUDA device is usable here|this machine has [0-9]+ CUDA device)")))
      << r.output;
  EXPECT_FALSE(fs::exists(run)) << "a run directory was left behind";
  const std::string cpu_run = dir("no-device-cpu");
  ASSERT_EQ(run_seqrec("train --data " + data() + " --out " + cpu_run + " " + kTrainSmall + "--epochs 1").code, 0);
  auto e = run_seqrec("eval --checkpoint " + cpu_run + "/best --data " + data() + " --device cuda:99 --threads 1");
  EXPECT_NE(e.code, 0) << e.output;
  EXPECT_TRUE(contains(e.output, "--device cuda:99")) << e.output;
}

// The GPU tier (skipped where no CUDA device is visible). A run on the device follows the CPU
// run: without dropout, the same batches and initialisation give the same parameters after an
// epoch and a half (float32 reduction order apart, which Adam's normalisation can blow up to
// one step, lr = 1e-3, on a near-zero gradient: 1e-3 relative + 1e-3 absolute) and the same
// validation metrics (1e-3); a CPU checkpoint resumes on the device and the device's on the
// CPU (pruning checkpoints on the way). Every model trains and tests there.
TEST_F(Cli, TrainsOnCudaAsOnCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible: this check runs on a GPU machine";
  const std::string common = "train --data " + data() + " " + kTrainSmall + "--dropout 0 --epochs 3 --final_test=false ";
  const std::string cpu = dir("cuda-twin-cpu"), gpu = dir("cuda-twin-gpu"), mixed = dir("cuda-twin-mixed");
  auto a = run_seqrec(common + "--out " + cpu + " --max_steps 15", 300);
  ASSERT_EQ(a.code, 0) << a.output;
  auto b = run_seqrec(common + "--out " + gpu + " --max_steps 15 --device cuda", 300);
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_TRUE(contains(b.output, "device=cuda:0")) << b.output;
  EXPECT_TRUE(contains(b.output, " length_groups=1")) << b.output;  // the device's default, the CPU's 8
  EXPECT_TRUE(contains(a.output, " length_groups=8")) << a.output;
  EXPECT_TRUE(contains(b.output, "peak GPU memory allocated=")) << b.output;
  auto pa = params_of(newest_checkpoint(cpu)), pb = params_of(newest_checkpoint(gpu));
  ASSERT_EQ(pa.size(), pb.size());
  for (auto& [n, t] : pa)
    EXPECT_TRUE(torch::allclose(t, pb.at(n), 1e-3, 1e-3)) << n << ": " << (t - pb.at(n)).abs().max();
  const auto metric = [](const std::string& line, const std::string& key) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(line, m, std::regex("\"" + key + "\": ?([0-9.eE+-]+)"))) << line;
    return m.size() > 1 ? std::stod(m[1]) : -1.0;
  };
  auto la = read_lines(cpu + "/metrics.jsonl"), lb = read_lines(gpu + "/metrics.jsonl");
  ASSERT_EQ(la.size(), lb.size());
  ASSERT_FALSE(la.empty());
  for (size_t i = 0; i < la.size(); ++i)
    EXPECT_NEAR(metric(la[i], "NDCG@10"), metric(lb[i], "NDCG@10"), 1e-3) << la[i] << "\n" << lb[i];
  // Across devices in both directions.
  ASSERT_EQ(run_seqrec(common + "--out " + mixed + " --max_steps 6", 300).code, 0);
  auto up = run_seqrec(common + "--out " + mixed + " --max_steps 12 --resume auto --device cuda", 300);
  ASSERT_EQ(up.code, 0) << up.output;
  EXPECT_TRUE(contains(up.output, "[resume]")) << up.output;
  auto down = run_seqrec(common + "--out " + mixed + " --max_steps 15 --resume auto", 300);
  ASSERT_EQ(down.code, 0) << down.output;
  auto pm = params_of(newest_checkpoint(mixed));
  for (auto& [n, t] : pa)
    EXPECT_TRUE(torch::allclose(t, pm.at(n), 1e-3, 1e-3)) << n << " after cpu -> cuda -> cpu: " << (t - pm.at(n)).abs().max();
  auto e = run_seqrec("eval --checkpoint " + newest_checkpoint(gpu) + " --data " + data() + " --split valid --device cuda");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_TRUE(contains(e.output, "split=valid")) << e.output;
  for (std::string m : {"linrec", "lisa --lisa_variant mini --codewords 4 --target_codewords 8 --codebook_update ema",
                        "lightsans --interests 4", "routing --heads 2 --routing_clusters 3 --routing_window 4",
                        "sasrec --objective cloze --mask_prob 0.3",
                        "flash4rec --flash_user embedding --moe_experts 3 --moe_top_k 2 --topk_dropout_k 3",
                        "flash4rec --flash_attention cosine --flash_user zero --objective cloze"}) {
    const std::string run = dir("cuda-model-" + std::to_string(std::hash<std::string>{}(m)));
    auto r = run_seqrec("train --data " + data() + " --out " + run + " " + kTrainSmall + "--epochs 2 --device cuda --model " + m, 300);
    EXPECT_EQ(r.code, 0) << m << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "split=test")) << m << "\n" << r.output;
  }
}

TEST_F(Cli, InvalidFlagsGetAClearErrorAndExitCode) {
  struct Case {
    std::string args, expect;
  };
  const std::string t = "train --data " + data() + " --out " + dir("flags") + " ";
  std::vector<Case> cases = {
      {t + "--max_len 0", "--max_len must be > 0"},
      {t + "--lr -0.1", "--lr must be > 0"},
      {t + "--model nosuch", "unknown model 'nosuch'"},
      {t + "--model lightsans --interests 0", "interests (LightSANs k) must be > 0"},
      {t + "--model lightsans --lightsans_position relative", "unknown lightsans_position 'relative'"},
      {t + "--model linrec --linrec_norm l1", "unknown linrec_norm 'l1'"},
      {t + "--ffn_activation tanh", "unknown ffn_activation 'tanh'"},
      {t + "--codewords 64", "--codewords applies to --model lisa only"},
      {t + "--model lisa --lisa_variant huge", "unknown lisa_variant 'huge'"},
      {t + "--model lisa --codewords 0", "codewords (LISA W) must be > 0"},
      {t + "--model routing --heads 2 --routing_heads 3", "routing_heads must be in [1, heads = 2]"},
      {t + "--model routing --routing_decay 1", "routing_decay must be in (0, 1)"},
      {t + "--routing_clusters 8", "--routing_clusters applies to --model routing only"},
      {t + "--replica_check_every -1", "--replica_check_every must be >= 0"},
      {t + "--model lisa --objective last", "objective last needs bidirectional attention"},
      {t + "--model routing --objective cloze", "objective cloze needs bidirectional attention"},
      {t + "--train_windows --train_prefixes", "--train_windows and --train_prefixes exclude each other"},
      {t + "--objective bert", "unknown objective 'bert'"},
      {t + "--model flash4rec", "flash_user features: the dataset has no user features"},
      {t + "--model flash4rec --flash_user zero --moe_experts 3 --moe_top_k 4", "moe_top_k must be in [1, moe_experts = 3]"},
      {t + "--model flash4rec --flash_user zero --capacity_factor 0", "capacity_factor must be > 0"},
      {t + "--model flash4rec --flash_user zero --expert_parallel 2", "--expert_parallel 2 must divide the number of ranks (1)"},
      {t + "--expert_parallel 0", "--expert_parallel must be >= 1"},
      {t + "--mask_prob 1", "--mask_prob must be in (0, 1)"},
      {t + "--loss hinge", "--loss must be"},
      {t + "--loss_negatives 10", "--loss_negatives applies to --loss sampled only (this run: --loss bce)"},
      {t + "--loss sampled --loss_negatives 0", "--loss_negatives must be >= 1, got 0"},
      {t + "--loss sampled --loss_sampler zipf", "--loss_sampler must be 'uniform' or 'popularity', got 'zipf'"},
      {t + "--lr_schedule step", "--lr_schedule must be constant, cosine or linear; got 'step'"},
      {t + "--label_smoothing 0.1", "--label_smoothing applies to --loss ce only (this run: --loss bce)"},
      {t + "--loss ce --label_smoothing 1", "--label_smoothing must be in [0, 1), got 1"},
      {t + "--weight_decay_mode adamw", "--weight_decay_mode must be l2 or decoupled, got 'adamw'"},
      {t + "--weight_decay_mode decoupled", "--weight_decay_mode decoupled decays nothing at --weight_decay 0"},
      {t + "--lr_schedule cosine --lr_final_ratio 2", "--lr_final_ratio must be in [0, 1]"},
      {t + "--lr_decay_from_epoch 5", "--lr_decay_from_epoch applies to a decaying --lr_schedule (cosine or linear)"},
      {t + "--lr_schedule cosine --lr_decay_from_epoch -1", "--lr_decay_from_epoch must be >= 0"},
      {t + "--no_such_flag 1", "no_such_flag"},
      {t + "--select_metric AUC", "--select_metric"},
      {t + "--host_allocator tcmalloc", "--host_allocator must be 'caching' or 'system', got 'tcmalloc'"},
      {t + "--softmax_keep_mib -1", "--softmax_keep_mib must be >= 0"},
      {t + "--matmul_precision low", "unknown --matmul_precision 'low' (known: highest, high, medium)"},
      {t + "--length_groups -1", "--length_groups must be >= 0"},
      {t + "--profile_steps -2", "--profile_steps must be >= 0"},
      {t + "--profile_steps 2 --profile_after -1", "--profile_after must be >= 0"},
      {t + "--device tpu", "--device 'tpu': expected cpu, cuda or cuda:N"},
      {t + "--device cuda:x", "--device 'cuda:x': expected cpu, cuda or cuda:N"},
      {"prepare --format nosuch --input x --out y", "nosuch"},
      {"prepare --format sasrec --input /nonexistent/file.txt --out " + dir("never"), "/nonexistent/file.txt"},
      {"prepare --format sasrec --input x --out y --lr 0.1", "does not apply"},
      {"frobnicate", "unknown subcommand"},
      {"train --out " + dir("nodata"), "--data is required"},
      {"train --data /nonexistent/ds --out " + dir("nodata2"), "/nonexistent/ds"},
  };
  for (auto& c : cases) {
    auto r = run_seqrec(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.code, 124) << c.args << ": timed out";
    EXPECT_TRUE(contains(r.output, c.expect)) << c.args << "\n" << r.output;
  }
  EXPECT_FALSE(fs::exists(dir("never")));
  // Flags that only the dataset or the world size can judge (user features, --expert_parallel)
  // fail before the run directory is made, as the others do.
  EXPECT_FALSE(fs::exists(dir("flags"))) << "a rejected flag left a run directory behind";
}

// --profile_steps: the chosen training steps run under Torch's profiler; rank 0 logs the largest
// ops and the seqrec regions, and the whole table goes to the run directory. A run that ends
// first reports the steps it profiled.
TEST_F(Cli, ProfilesTheRequestedTrainingSteps) {
  const std::string run = dir("profile");
  auto r = run_seqrec("train --data " + data() + " --out " + run + " " + kTrainSmall +
                      "--max_steps 6 --profile_steps 3 --profile_after 2 --final_test=false", 300);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[profile] 3 training step(s), 3 to 5, rank 0, 1 thread(s)")) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\[profile\] +[0-9.]+ +[0-9.]+% +[0-9.]+ +[0-9]+ +aten::)"))) << r.output;
  auto table = read_lines(run + "/profile-rank0.txt");
  std::string text;
  for (auto& l : table) text += l + "\n";
  for (const char* region : {"seqrec::forward", "seqrec::backward", "seqrec::attention", "seqrec::feed_forward",
                             "seqrec::loss", "seqrec::optimizer", "directly in seqrec::attention"})
    EXPECT_TRUE(contains(text, region)) << region << "\n" << text;
  EXPECT_FALSE(contains(text, "seqrec::evaluation")) << "no validation in steps 3-5:\n" << text;

  const std::string early = dir("profile-early");
  auto e = run_seqrec("train --data " + data() + " --out " + early + " " + kTrainSmall +
                      "--max_steps 4 --profile_steps 10 --profile_after 2 --final_test=false", 300);
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_TRUE(contains(e.output, "[profile] 2 training step(s), 3 to 4")) << e.output;
  EXPECT_TRUE(fs::exists(early + "/profile-rank0.txt"));
}

// --fused_kernels reaches the ops: LinRec's profiled steps run the fused causal kernel by
// default and only its ATen reference with --fused_kernels=false.
TEST_F(Cli, FusedKernelsFlagChoosesKernelOrReference) {
  for (const bool fused : {true, false}) {
    const std::string run = dir(fused ? "kernels-on" : "kernels-off");
    auto r = run_seqrec("train --data " + data() + " --out " + run + " " + kTrainSmall +
                            "--model linrec --max_steps 3 --profile_steps 1 --profile_after 1 --final_test=false" +
                            (fused ? "" : " --fused_kernels=false"),
                        300);
    ASSERT_EQ(r.code, 0) << r.output;
    std::string text;
    for (auto& l : read_lines(run + "/profile-rank0.txt")) text += l + "\n";
    EXPECT_EQ(contains(text, "CausalLinearAttentionFused"), fused) << text;
    EXPECT_TRUE(contains(text, "seqrec::attention")) << text;
  }
}

TEST_F(Cli, HelpListsOnlyTheSubcommandsFlags) {
  auto r = run_seqrec("train --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.output, "--max_len"));
  EXPECT_FALSE(contains(r.output, "--behaviors"));
  auto top = run_seqrec("--help");
  EXPECT_TRUE(contains(top.output, "prepare"));
  EXPECT_TRUE(contains(top.output, "synth"));
}

// Every shipped config parses, builds its model and trains: a config that names a removed or
// renamed flag, or an invalid combination, fails here rather than in a user's long run.
TEST_F(Cli, EveryShippedConfigTrains) {
  const char* src = std::getenv("SEQREC_SOURCE_DIR");
  if (!src) GTEST_SKIP() << "SEQREC_SOURCE_DIR is not set (run through ctest)";
  int configs = 0;
  for (auto& e : fs::recursive_directory_iterator(std::string(src) + "/configs")) {
    if (e.path().extension() != ".flags") continue;
    ++configs;
    const std::string run = dir("config-" + std::to_string(configs));
    const std::string text = read_file(e.path().string());
    // The synthetic data has no user features: configs that read them get a zero user vector.
    const std::string users = text.find("--flash_user=features") != std::string::npos ? " --flash_user=zero" : "";
    auto r = run_seqrec("train --flagfile " + e.path().string() + " --data " + data() + " --out " + run +
                            " --max_steps 2 --batch_size 16 --final_test=false --threads 1 --log_every 1000" + users,
                        300);
    EXPECT_EQ(r.code, 0) << e.path() << "\n" << r.output;
    // The setup log names the variant's own options (common/linrec.flags takes the pad keys).
    if (text.find("--linrec_pad_keys=true") != std::string::npos) {
      EXPECT_TRUE(contains(r.output, "[setup] linrec: linrec_norm=paper linrec_pad_keys=true")) << r.output;
    }
  }
  EXPECT_GE(configs, 10);
}

// FLASH4Rec's user-aware gate on ML-1M's real user features (users.dat joined through the
// SASRec user id map): prepare stores them, training reads them.
TEST_F(Cli, Flash4recReadsMl1mUserFeatures) {
  const char* shared = std::getenv("SEQREC_SHARED_DATA");
  const std::string ml = shared ? std::string(shared) + "/ml-1m" : "";
  if (ml.empty() || !fs::exists(ml + "/users.dat") || !fs::exists(ml + "/sasrec/ml-1m.txt.xz"))
    GTEST_SKIP() << "ML-1M (users.dat, sasrec/ml-1m.txt.xz) not under SEQREC_SHARED_DATA";
  const std::string ds = dir("ml-1m-features"), run = dir("ml-1m-flash");
  auto p = run_seqrec("prepare --format sasrec --input " + ml + "/sasrec/ml-1m.txt.xz --user_features " + ml +
                          "/users.dat --user_id_map " + ml + "/sasrec/sas_to_original_users.txt --out " + ds +
                          " --progress=false",
                      300);
  ASSERT_EQ(p.code, 0) << p.output;
  auto r = run_seqrec("train --data " + ds + " --out " + run + " --model flash4rec --max_len 20 --hidden 16 " +
                          "--batch_size 64 --max_steps 3 --final_test=false --threads 1 --log_every 1000",
                      300);
  ASSERT_EQ(r.code, 0) << r.output;
  auto info = run_seqrec("info --checkpoint " + run + "/checkpoints");
  EXPECT_TRUE(contains(info.output, "user_feature_cardinalities=2,7,21,10")) << info.output;
}

TEST_F(Cli, FlagfileReproducesTheFlags) {
  const std::string ff = dir("cfg.flags");
  std::ofstream(ff) << "--max_len=0\n";
  auto r = run_seqrec("train --flagfile " + ff + " --data " + data() + " --out " + dir("ff"));
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "--max_len must be > 0")) << r.output;
}

// A run's flags.txt is itself a flagfile: the run continues from it with nothing retyped but the
// resume and a new budget, and ends where the run never stopped ends. A flagfile with name=value
// lines (flags.txt before 2026-12-06) is refused by name: gflags would skip the flags silently.
TEST_F(Cli, RunFlagsFileContinuesTheRun) {
  const std::string whole = dir("flagsfile-whole"), split = dir("flagsfile-split");
  const std::string common =
      "train --data " + data() + " " + kTrainSmall + "--epochs 5 --final_test=false --lr 0.003 --dropout 0.3 ";
  auto w = run_seqrec(common + "--out " + whole + " --max_steps 14", 300);
  ASSERT_EQ(w.code, 0) << w.output;
  auto a = run_seqrec(common + "--out " + split + " --max_steps 6", 300);
  ASSERT_EQ(a.code, 0) << a.output;
  const std::string flags = read_file(split + "/flags.txt");
  EXPECT_EQ(flags.rfind("# ", 0), 0u) << flags;
  EXPECT_TRUE(contains(flags, "\n--data=" + data() + "\n")) << flags;
  auto b = run_seqrec("train --flagfile " + split + "/flags.txt --resume auto --max_steps 14 --threads 1", 300);
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_TRUE(contains(b.output, "[resume]")) << b.output;
  auto pw = params_of(newest_checkpoint(whole)), ps = params_of(newest_checkpoint(split));
  ASSERT_EQ(pw.size(), ps.size());
  ASSERT_FALSE(pw.empty());
  for (auto& [n, t] : pw) EXPECT_TRUE(torch::equal(t, ps.at(n))) << n << " differs after the resume from flags.txt";

  const std::string old = dir("old-flags.txt"), out = dir("old-flags-run");
  std::ofstream(old) << "# written before 2026-12-06\n\nmax_len=0\n";
  auto r = run_seqrec("train --flagfile " + old + " --data " + data() + " --out " + out);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, old + ", line 3: 'max_len=0' is not a --flag=value line")) << r.output;
  EXPECT_TRUE(contains(r.output, "prefix each line with --")) << r.output;
  EXPECT_FALSE(fs::exists(out));
  auto missing = run_seqrec("train --flagfile=" + dir("no-such.flags") + " --data " + data() + " --out " + out);
  EXPECT_EQ(missing.code, 2) << missing.output;
  EXPECT_TRUE(contains(missing.output, "--flagfile " + dir("no-such.flags") + ": cannot be read (No such file"))
      << missing.output;
  EXPECT_FALSE(fs::exists(out));
}

// `seqrec --version` names the build; each sitting logs it and its machine, checkpoints record
// the build, and a run resumed by another build says so in its log and in `seqrec info`. The
// other build is a copy of this executable whose marked revision is overwritten.
TEST_F(Cli, RunsNameTheirBuildAndMachine) {
  auto v = run_seqrec("--version");
  ASSERT_EQ(v.code, 0) << v.output;
  const std::string rev = revision_of(seqrec_bin());
  ASSERT_FALSE(rev.empty()) << v.output;
  EXPECT_TRUE(contains(v.output, "LibTorch ")) << v.output;
  EXPECT_EQ(run_seqrec("version").output, v.output);
  auto extra = run_seqrec("--version " + data());
  EXPECT_EQ(extra.code, 2) << extra.output;
  EXPECT_TRUE(contains(extra.output, "takes no arguments")) << extra.output;
  const std::string mine = v.output.substr(0, v.output.find('\n'));

  std::string why;
  const std::string other_bin = dir("seqrec-other-build");
  const std::string other = copy_as_another_build(other_bin, &why);
  ASSERT_FALSE(other.empty()) << why;
  auto ov = run_command(other_bin + " --version");
  ASSERT_EQ(ov.code, 0) << ov.output;
  EXPECT_TRUE(contains(ov.output, "seqrec " + other + " (LibTorch ")) << ov.output;
  const std::string theirs = ov.output.substr(0, ov.output.find('\n'));

  const std::string run = dir("builds");
  const std::string common = " train --data " + data() + " --out " + run + " " + kTrainSmall + "--epochs 5 --final_test=false ";
  auto a = run_command(other_bin + common + "--max_steps 6", 300);
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_TRUE(contains(a.output, "[setup] build: " + theirs)) << a.output;
  auto b = run_seqrec(common + "--max_steps 14 --resume auto", 300);
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_TRUE(contains(b.output, "[resume] the checkpoint was written by " + theirs + "; this sitting runs " + mine))
      << b.output;
  EXPECT_TRUE(contains(b.output, "[setup] build: " + mine)) << b.output;
  std::string cpu;
  for (const auto& line : read_lines("/proc/cpuinfo"))
    if (cpu.empty() && line.rfind("model name", 0) == 0) cpu = line.substr(line.find_first_not_of(" \t", line.find(':') + 1));
  char host[256] = {0};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  EXPECT_TRUE(contains(b.output, std::string("[setup] machine: host ") + host + ", CPU " + (cpu.empty() ? "unknown" : cpu) +
                                     " (" + std::to_string(std::thread::hardware_concurrency()) + " logical cores)\n"))
      << b.output;
  auto info = run_seqrec("info " + run);
  ASSERT_EQ(info.code, 0) << info.output;
  EXPECT_TRUE(contains(info.output, "  builds: sitting 1: " + theirs + "; sitting 2: " + mine + "\n")) << info.output;
  auto ck = run_seqrec("info " + newest_checkpoint(run));
  EXPECT_TRUE(contains(ck.output, "build: " + mine)) << ck.output;
  // One build throughout: named once.
  const std::string one = dir("one-build");
  auto d = run_seqrec(" train --data " + data() + " --out " + one + " " + kTrainSmall + "--epochs 1 --final_test=false", 300);
  ASSERT_EQ(d.code, 0) << d.output;
  EXPECT_TRUE(contains(run_seqrec("info " + one).output, "  build: " + mine + "\n"));
  // A third sitting by the same build as the second: grouped.
  auto c = run_seqrec(common + "--max_steps 18 --resume auto", 300);
  ASSERT_EQ(c.code, 0) << c.output;
  EXPECT_FALSE(contains(c.output, "written by")) << c.output;
  info = run_seqrec("info " + run);
  EXPECT_TRUE(contains(info.output, "  builds: sitting 1: " + theirs + "; sittings 2-3: " + mine + "\n")) << info.output;
  EXPECT_TRUE(contains(info.output, std::string("  machine (the last finished sitting): host ") + host + ", CPU "))
      << info.output;
}

// `seqrec recommend`: top-k items from a checkpoint, named by the raw ids of the input file, for
// users of the dataset or for a history of items given on the command line; every bad request
// named, and a file written only when whole.
TEST_F(Cli, RecommendsFromACheckpointByRawIds) {
  // 40 users "user<u>" over 30 items "item<i>", 8 events each: user u sees items u%30+1, +1, ...
  const std::string csv = dir("rec.csv"), ds = dir("rec-data"), run = dir("rec-run");
  std::map<std::string, std::vector<std::string>> seen;
  {
    std::ofstream out(csv);
    for (int u = 0; u < 40; ++u)
      for (int t = 0; t < 8; ++t) {
        const std::string item = "item" + std::to_string((u + t) % 30 + 1);
        out << "user" << u << "," << item << "," << 1000 + t << "\n";
        seen["user" + std::to_string(u)].push_back(item);
      }
  }
  auto r = run_seqrec("prepare --format generic --columns user,item,time --input " + csv + " --out " + ds +
                      " --progress=false");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_seqrec("train --data " + ds + " --out " + run + " " + kTrainSmall +
                 "--epochs 2 --eval_protocol full --full_ranking=false");
  ASSERT_EQ(r.code, 0) << r.output;

  const std::string tsv = dir("rec.tsv");
  const std::string base = "recommend --checkpoint " + run + "/best --threads 1 ";
  r = run_seqrec(base + "--user_ids user7,user31 --top_k 4 --exclude_history --out " + tsv);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[recommend] --data not given: the checkpoint's dataset, " + ds)) << r.output;
  auto lines = read_lines(tsv);
  ASSERT_EQ(lines.size(), 2u + 2 * 4) << read_file(tsv);
  // The protocol of the list: which checkpoint, dataset, history, candidates and k.
  EXPECT_TRUE(contains(lines[0], "# seqrec recommend: checkpoint " + run + "/best/step-")) << lines[0];
  EXPECT_TRUE(contains(lines[0], "candidates: all 30 items less the history's; k 4")) << lines[0];
  EXPECT_TRUE(contains(lines[0], "history: each user's whole sequence")) << lines[0];
  EXPECT_EQ(lines[1], "user\trank\titem\tscore");
  for (size_t i = 2; i < lines.size(); ++i) {
    std::stringstream row(lines[i]);
    std::string user, rank, item, score;
    ASSERT_TRUE(std::getline(row, user, '\t') && std::getline(row, rank, '\t') && std::getline(row, item, '\t') &&
                std::getline(row, score, '\t')) << lines[i];
    EXPECT_EQ(user, i < 6 ? "user7" : "user31") << "rows come in the order asked";
    EXPECT_EQ(rank, std::to_string((i - 2) % 4 + 1));
    EXPECT_TRUE(std::regex_match(item, std::regex("item([1-9]|[12][0-9]|30)"))) << "raw item ids: " << lines[i];
    const auto& history = seen[user];
    EXPECT_TRUE(std::find(history.begin(), history.end(), item) == history.end())
        << item << " is in " << user << "'s history: " << lines[i];
    if ((i - 2) % 4 > 0) {
      const std::string above = lines[i - 1].substr(lines[i - 1].rfind('\t') + 1);
      EXPECT_GE(std::stod(above), std::stod(score)) << "best first";
    }
  }
  // Every user, to stdout: a header, the column line, 40 x 3 rows.
  r = run_seqrec(base + "--data " + ds + " --top_k 3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 2 + 40 * 3) << r.output;
  EXPECT_TRUE(contains(r.output, "\nuser39\t3\titem")) << r.output;
  // A history given item by item, as a user outside the dataset.
  const std::string given = dir("given.tsv");
  r = run_seqrec(base + "--history item3,item4,item5 --top_k 2 --out " + given);
  ASSERT_EQ(r.code, 0) << r.output;
  lines = read_lines(given);
  ASSERT_EQ(lines.size(), 4u) << read_file(given);
  EXPECT_TRUE(contains(lines[0], "history: the 3 items given")) << lines[0];
  EXPECT_TRUE(std::regex_match(lines[2], std::regex("-\t1\titem[0-9]+\t[-0-9.e+]+"))) << lines[2];

  // Bad requests: named, non-zero, and the file already written stays as it was, no leftovers.
  const std::string before = read_file(tsv);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--user_ids user7,nobody", "unknown user id 'nobody': not in the dataset"},
      {"--history item3,item99", "unknown item id 'item99': not in the dataset"},
      {"--user_ids user7 --history item3", "--user_ids and --history exclude each other"},
      {"--top_k 31", "--top_k 31 exceeds the dataset's 30 items"},
      {"--top_k 0", "--top_k must be > 0, got 0"},
      {"--user_ids ,", "--user_ids names no user"},
  };
  for (const auto& [flags, message] : bad) {
    r = run_seqrec(base + flags + " --out " + tsv);
    EXPECT_NE(r.code, 0) << flags;
    EXPECT_NE(r.code, 124) << flags;
    EXPECT_TRUE(contains(r.output, message)) << flags << ": " << r.output;
    EXPECT_EQ(read_file(tsv), before) << flags;
  }
  r = run_seqrec(base + "--out " + dir("no-such-dir") + "/rec.tsv");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.output, "cannot write " + dir("no-such-dir") + "/rec.tsv")) << r.output;
  r = run_seqrec("recommend --checkpoint " + run + " --threads 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.output, "is a run directory: name its best/")) << r.output;
  for (auto& e : fs::directory_iterator(*root_))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << "left behind: " << e.path();

  // A model with a learned vector per dataset user has none for a history from outside it.
  const std::string per_user = dir("rec-flash");
  r = run_seqrec("train --data " + ds + " --out " + per_user + " " + kTrainSmall +
                 "--model flash4rec --flash_user embedding --max_steps 2 --final_test=false --eval_protocol full");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_seqrec("recommend --checkpoint " + per_user + "/checkpoints --threads 1 --history item3");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.output, "learned one vector per dataset user (--flash_user embedding)")) << r.output;
  r = run_seqrec("recommend --checkpoint " + per_user + "/checkpoints --threads 1 --user_ids user3 --top_k 2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "model flash4rec")) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("\nuser3\t2\titem[0-9]+\t"))) << r.output;
}

TEST_F(Cli, CorruptShardsAreNamed) {
  const std::string copy = dir("corrupt");
  fs::copy(data(), copy, fs::copy_options::recursive);
  const std::string shard = copy + "/shard-00001-of-00002.h5";
  ASSERT_TRUE(fs::exists(shard));
  fs::resize_file(shard, fs::file_size(shard) / 2);
  auto r = run_seqrec("train --data " + copy + " --out " + dir("corrupt-run") + " " + kTrainSmall + "--max_steps 1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124);
  EXPECT_TRUE(contains(r.output, "shard-00001-of-00002.h5")) << r.output;
}

TEST_F(Cli, PrepareReportsMalformedRowsAndLeavesNothingBehind) {
  const std::string in = dir("bad.txt"), out = dir("bad-ds");
  std::ofstream(in) << "1 5\n1 6\n2 x7\n";
  auto r = run_seqrec("prepare --format sasrec --input " + in + " --out " + out + " --progress=false");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "bad.txt:3")) << r.output;
  EXPECT_FALSE(fs::exists(out));
  std::ofstream(dir("empty.txt")) << "";
  r = run_seqrec("prepare --format sasrec --input " + dir("empty.txt") + " --out " + out + " --progress=false");
  EXPECT_NE(r.code, 0);
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
