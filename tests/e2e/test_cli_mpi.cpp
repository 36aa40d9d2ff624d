// Data parallel over real MPI processes: N ranks with per-rank batch b must train exactly
// as 1 rank with batch N*b (up to fp32 summation order), ranks with different flags must
// fail fast naming the rank, and a dead rank must not hang the job.
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>

#include "io/remove_tree.h"
#include "tests/e2e/cli_harness.h"
#include "train/checkpoint.h"

namespace {
namespace fs = std::filesystem;
using namespace seqrec::testing;

class CliMpi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(scratch_dir("mpi"));
    // 3 shards so that 1, 2 and 3 ranks each own a different share.
    auto r = run_seqrec("synth --out " + data() + " --users 240 --items 300 --events 6000 --seed 11 --shards 3 --progress=false");
    ASSERT_EQ(r.code, 0) << r.output;
  }
  static void TearDownTestSuite() {
    seqrec::io::remove_tree(*root_);
    delete root_;
  }
  static std::string data() { return *root_ + "/data"; }
  static std::string dir(const std::string& n) { return *root_ + "/" + n; }
  static std::string* root_;
};
std::string* CliMpi::root_ = nullptr;

std::map<std::string, at::Tensor> final_params(const std::string& run, const std::string& prefix = "param/") {
  std::string newest;
  for (auto& e : fs::directory_iterator(run + "/checkpoints"))
    if (e.path().filename().string().rfind("step-", 0) == 0) newest = std::max(newest, e.path().string());
  auto b = seqrec::train::read_bundle_file(newest + "/shared.bin");
  std::map<std::string, at::Tensor> out;
  for (auto& [n, t] : b.tensors)
    if (n.rfind(prefix, 0) == 0) out[n] = t;
  return out;
}

std::string train_args(const std::string& data, const std::string& out, int batch) {
  // Dropout off: the only randomness left is per example (negatives, shuffling), which is
  // keyed by (seed, epoch, global user id) and so identical at every world size.
  return " train --data " + data + " --out " + out + " --max_len 16 --hidden 16 --blocks 2 --heads 2 --dropout 0 " +
         "--batch_size " + std::to_string(batch) + " --max_steps 6 --final_test=false --threads 1 --log_every 1000 " +
         "--epochs 10 --adam_eps 1";
}

// The largest element difference between same-named tensors of two runs' maps (infinity for a
// name that `b` lacks).
double max_difference(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  double worst = 0;
  for (auto& [n, t] : a) {
    auto it = b.find(n);
    worst = it == b.end() ? std::numeric_limits<double>::infinity()
                          : std::max(worst, (t - it->second).abs().max().item<double>());
  }
  return worst;
}

// One run at 1 rank with a batch of 8·np and one at np ranks with 8 each, both with `extra`
// (the np-rank one also with `multi_extra`), into dir(name)-single and dir(name)-multi; a run
// that fails fails the test.
struct RankPair {
  std::string single, multi, multi_output;
};
void run_ranks_against_one(const std::string& data, const std::string& name, int np, const std::string& extra,
                           RankPair* r, const std::string& multi_extra = "") {
  r->single = name + "-single";
  r->multi = name + "-multi";
  auto a = run_seqrec(train_args(data, r->single, 8 * np) + extra, 300);
  ASSERT_EQ(a.code, 0) << a.output;
  auto b = run_command(mpirun() + " -np " + std::to_string(np) + " " + seqrec_bin() + train_args(data, r->multi, 8) +
                           extra + multi_extra,
                       300);
  ASSERT_EQ(b.code, 0) << b.output;
  r->multi_output = b.output;
}

// The largest parameter difference between the pair's two runs (infinity where the multi-rank
// run lacks a parameter the single one has).
double params_difference(const RankPair& r) {
  auto pa = final_params(r.single), pb = final_params(r.multi);
  EXPECT_EQ(pa.size(), pb.size());
  return max_difference(pa, pb);
}

TEST_F(CliMpi, RanksTrainExactlyAsOneRankWithTheGlobalBatch) {
  for (int np : {2, 3}) {
    RankPair r;
    ASSERT_NO_FATAL_FAILURE(run_ranks_against_one(data(), dir("plain" + std::to_string(np)), np, "", &r));
    EXPECT_TRUE(contains(r.multi_output, "ranks=" + std::to_string(np))) << r.multi_output;
    auto pa = final_params(r.single), pb = final_params(r.multi);
    ASSERT_EQ(pa.size(), pb.size());
    const double worst = max_difference(pa, pb);
    // Gradients differ only in fp32 summation order (per-rank partial sums, then the
    // all-reduce): ~1e-7 relative. With Adam's default eps a gradient component near zero
    // turns that rounding into a +-lr step (m / sqrt(v) is its sign), so the run uses
    // eps = 1, where the update is smooth in the gradient: then rounding stays ~1e-7 and a
    // missing or doubled example (a gradient change of >= 1/(global batch) relative)
    // moves parameters by > 1e-5.
    EXPECT_LT(worst, 1e-6) << "np " << np << ": max |delta param| " << worst;
  }
}

// The cloze objective's masks are keyed by (seed, epoch, user, slot), not by rank: 2 ranks
// still train as 1 rank with the global batch.
TEST_F(CliMpi, ClozeMasksDoNotDependOnTheRankCount) {
  RankPair r;
  ASSERT_NO_FATAL_FAILURE(run_ranks_against_one(data(), dir("cloze"), 2, " --objective cloze --mask_prob 0.3", &r));
  const double worst = params_difference(r);
  EXPECT_LT(worst, 1e-6) << "max |delta param| " << worst;  // as above: summation order only
}

// The sampled softmax's draw is keyed by (seed, step), not by rank: every rank scores its targets
// against the same items, so 2 ranks still train as 1 rank with the global batch.
TEST_F(CliMpi, SampledSoftmaxDrawsDoNotDependOnTheRankCount) {
  RankPair r;
  ASSERT_NO_FATAL_FAILURE(run_ranks_against_one(data(), dir("sampled"), 2, " --loss sampled --loss_negatives 40 --loss_sampler popularity", &r));
  EXPECT_TRUE(contains(r.multi_output, "[setup] loss: sampled softmax over the target and 40 items per step")) << r.multi_output;
  const double worst = params_difference(r);
  EXPECT_LT(worst, 1e-6) << "max |delta param| " << worst;  // as above: summation order only
}

// Recommending is one process's work: under mpirun every rank says so and the job ends.
TEST_F(CliMpi, RecommendUnderMpirunIsRefused) {
  const std::string run = dir("rec-run");
  auto r = run_seqrec(train_args(data(), run, 8) + " --max_steps 2", 120);
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_command(mpirun() + " -np 2 " + seqrec_bin() + " recommend --threads 1 --checkpoint " + run + "/checkpoints",
                  120);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "no hang";
  EXPECT_TRUE(contains(r.output, "recommend runs as one process (2 ranks here): start it without mpirun/srun"))
      << r.output;
}

// LinRec as its released code trains it: every prefix of a history an example, scored at its
// last slot through the global (bidirectional) form. The prefixes are dealt out by global
// example index, so 2 ranks still train as 1 rank with the global batch.
TEST_F(CliMpi, PrefixExamplesDoNotDependOnTheRankCount) {
  RankPair r;
  ASSERT_NO_FATAL_FAILURE(
      run_ranks_against_one(data(), dir("prefix"), 2, " --model linrec --objective last --train_prefixes", &r));
  EXPECT_TRUE(contains(r.multi_output, "examples=every prefix")) << r.multi_output;
  const double worst = params_difference(r);
  EXPECT_LT(worst, 1e-6) << "max |delta param| " << worst;  // as above: summation order only
}

// LISA's EMA codebooks: each rank's assignment counts and residual sums are all-reduced before
// the update, so the codebooks after K steps match one rank with the global batch.
TEST_F(CliMpi, EmaCodebooksMatchOneRankWithTheGlobalBatch) {
  const std::string lisa = " --model lisa --codebook_update ema --codebooks 2 --codewords 8 --norm_first=false "
                           "--ema_decay 0.8 --blocks 1";
  for (int np : {2, 3}) {
    RankPair r;
    ASSERT_NO_FATAL_FAILURE(run_ranks_against_one(data(), dir("ema" + std::to_string(np)), np, lisa, &r));
    auto ba = final_params(r.single, "buffer/"), bb = final_params(r.multi, "buffer/");
    ASSERT_EQ(ba.size(), bb.size());
    ASSERT_TRUE(ba.count("buffer/codes.sequence_pq.codebooks")) << "no EMA codebooks in the checkpoint";
    const double worst = max_difference(ba, bb);
    // The statistics are sums of the same per-item terms in another order (~1e-7 relative);
    // one item missing or counted twice would move a codeword's mean by >= 1e-3.
    EXPECT_LT(worst, 1e-5) << "np " << np << ": max |delta EMA buffer| " << worst;
    EXPECT_LT(max_difference(final_params(r.single), final_params(r.multi)), 1e-5) << "np " << np;
  }
}

// Routing attention's k-means centroids: per-centroid counts and sums all-reduced before the
// EMA update, so after K steps N ranks hold the centroids of one rank with the global batch.
TEST_F(CliMpi, RoutingCentroidsMatchOneRankWithTheGlobalBatch) {
  const std::string routing = " --model routing --routing_clusters 3 --routing_window 3 --routing_decay 0.7";
  for (int np : {2, 3}) {
    RankPair r;
    ASSERT_NO_FATAL_FAILURE(
        run_ranks_against_one(data(), dir("rt" + std::to_string(np)), np, routing, &r, " --replica_check_every 1"));
    auto ba = final_params(r.single, "buffer/"), bb = final_params(r.multi, "buffer/");
    ASSERT_EQ(ba.size(), bb.size());
    ASSERT_TRUE(ba.count("buffer/block1.attn.centroids")) << "no routing centroids in the checkpoint";
    const double worst = max_difference(ba, bb);
    // Sums of the same per-slot unit vectors in another order (~1e-7 relative); one slot
    // missing or counted twice moves a centroid by ~1e-2 at decay 0.7.
    EXPECT_LT(worst, 1e-5) << "np " << np << ": max |delta routing buffer| " << worst;
    EXPECT_LT(max_difference(final_params(r.single), final_params(r.multi)), 1e-5) << "np " << np;
  }
}

TEST_F(CliMpi, ARunSavedAtTwoRanksResumesAtOne) {
  // 2 ranks x 8 for 3 steps, then 1 rank x 16 up to step 6, against 1 rank x 16 throughout:
  // the global batch and the example stream are the same, so the parameters agree up to
  // fp32 summation order (same tolerance argument as above).
  const std::string split = dir("resume-split"), whole = dir("resume-whole");
  auto args = [&](const std::string& out, int batch, int steps) {
    std::string a = train_args(data(), out, batch);
    return a.replace(a.find("--max_steps 6"), 13, "--max_steps " + std::to_string(steps));
  };
  auto a = run_command(mpirun() + " -np 2 " + seqrec_bin() + args(split, 8, 3), 300);
  ASSERT_EQ(a.code, 0) << a.output;
  auto b = run_seqrec(args(split, 16, 6) + " --resume auto", 300);
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_TRUE(contains(b.output, "saved with 2 ranks, resuming with 1")) << b.output;
  auto c = run_seqrec(args(whole, 16, 6), 300);
  ASSERT_EQ(c.code, 0) << c.output;
  EXPECT_LT(max_difference(final_params(split), final_params(whole)), 1e-6);
}

// Expert parallelism: 6 experts per layer split over 2 ranks (3 each) for 3 steps, resumed at
// 1 rank (all 6 local) and at 3 ranks (2 each) up to step 6, against 1 rank throughout. The
// global batch is 24 everywhere and capacity, gating and dispatch are defined on the global
// batch, so every layout trains the same model up to fp32 summation order. (Gating noise and
// Top-K dropout are off: their seeds are per rank by design.)
TEST_F(CliMpi, ExpertParallelRunsResumeAtOtherLayouts) {
  const std::string flash = " --model flash4rec --flash_user embedding --moe_experts 6 --moe_top_k 2 "
                            "--capacity_factor 0.75 --moe_noise=false --topk_dropout 0";
  auto args = [&](const std::string& out, int batch, int steps) {
    std::string a = train_args(data(), out, batch) + flash;
    return a.replace(a.find("--max_steps 6"), 13, "--max_steps " + std::to_string(steps));
  };
  const std::string whole = dir("ep-whole"), to1 = dir("ep-to1"), to3 = dir("ep-to3");
  auto w = run_seqrec(args(whole, 24, 6), 300);
  ASSERT_EQ(w.code, 0) << w.output;
  for (const auto& [run, np] : std::vector<std::pair<std::string, int>>{{to1, 1}, {to3, 3}}) {
    auto a = run_command(mpirun() + " -np 2 " + seqrec_bin() + args(run, 12, 3) + " --expert_parallel 2", 300);
    ASSERT_EQ(a.code, 0) << a.output;
    auto b = run_command(mpirun() + " -np " + std::to_string(np) + " " + seqrec_bin() + args(run, 24 / np, 6) +
                             " --expert_parallel " + std::to_string(np) + " --resume auto",
                         300);
    ASSERT_EQ(b.code, 0) << b.output;
    auto pa = final_params(whole), pb = final_params(run);
    ASSERT_EQ(pa.size(), pb.size()) << "every expert is in the checkpoint, keyed by global id";
    ASSERT_TRUE(pa.count("param/block1.moe.experts.expert5.fc2.weight"));
    double worst = 0;
    std::string where;
    for (auto& [n, t] : pa) {
      const double d = (t - pb.at(n)).abs().max().item<double>();
      if (d > worst) worst = d, where = n;
    }
    // Adam with eps 1 keeps fp32 summation-order noise at ~1e-7 (see above); a token routed or
    // dropped differently moves an expert's weights by > 1e-4.
    EXPECT_LT(worst, 1e-5) << "resumed at " << np << " ranks: max |delta param| " << worst << " in " << where;
  }
  // A rank with no data at all (3 ranks, 2 shards) still takes part in every step's and every
  // evaluation batch's collectives: training, validation and the final test complete.
  const std::string two = dir("data-2shards");
  auto s2 = run_seqrec("synth --out " + two + " --users 120 --items 200 --events 3000 --seed 5 --shards 2 --progress=false");
  ASSERT_EQ(s2.code, 0) << s2.output;
  auto idle = run_command(mpirun() + " -np 3 " + seqrec_bin() + " train --data " + two + " --out " +
                              dir("ep-idle") + " --max_len 16 --hidden 16 --blocks 1 --heads 1 --batch_size 8 " +
                              "--epochs 1 --eval_every 1 --eval_negatives 20 --threads 1 --log_every 1000" + flash + " --expert_parallel 3",
                          300);
  ASSERT_EQ(idle.code, 0) << idle.output;
  EXPECT_TRUE(contains(idle.output, "split=test")) << idle.output;

  auto bad = run_command(mpirun() + " -np 2 " + seqrec_bin() + args(dir("ep-bad"), 12, 2) +
                             " --moe_experts 3 --moe_top_k 1 --expert_parallel 2",
                         120);
  EXPECT_NE(bad.code, 0);
  EXPECT_TRUE(contains(bad.output, "--moe_experts 3 is not divisible by --expert_parallel 2")) << bad.output;
  EXPECT_FALSE(fs::exists(dir("ep-bad"))) << "the rejected layout left a run directory behind";
}

// Where no CUDA device is usable, several ranks asking for one are refused on every rank, with
// the reason, before the run directory is made, and nothing hangs.
TEST_F(CliMpi, CudaWithoutADeviceIsRefusedOnEveryRankBeforeAnythingIsWritten) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is visible: RanksOnCudaTrainAsOneRank covers it";
  const std::string out = dir("cuda-ranks");
  auto r = run_command(mpirun() + " -np 2 " + seqrec_bin() + train_args(data(), out, 8) + " --device cuda", 60);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.code, 124) << "hung";
  EXPECT_TRUE(contains(r.output, "--device cuda: no CUDA device is usable here")) << r.output;
  EXPECT_FALSE(fs::exists(out)) << "a run directory was left behind";
}

// The GPU tier: ranks on CUDA devices (here as many as the machine has, several ranks sharing
// one where it has fewer) train as one rank with the global batch, their gradients and EMA
// statistics all-reduced through the MPI backend's host staging. SASRec, and routing attention
// and LISA, whose centroids and codebooks are EMA buffers updated from all-reduced statistics.
// Tolerance 1e-5: the device's reductions (the embedding's gradient by atomic adds among them)
// come in another order from run to run, ~1e-7 relative; a missing or doubled example moves
// parameters by > 1e-5 (RanksTrainExactlyAsOneRankWithTheGlobalBatch).
TEST_F(CliMpi, RanksOnCudaTrainAsOneRankWithTheGlobalBatch) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible: this check runs on a GPU machine";
  const std::vector<std::pair<std::string, std::string>> models = {
      {"sasrec", ""},
      {"routing", " --model routing --routing_clusters 3 --routing_window 3 --routing_decay 0.7"},
      {"lisa", " --model lisa --codebook_update ema --codebooks 2 --codewords 8 --norm_first=false --ema_decay 0.8 "
               "--blocks 1"}};
  for (const auto& [name, flags] : models) {
    RankPair r;
    ASSERT_NO_FATAL_FAILURE(run_ranks_against_one(data(), dir("cuda-" + name), 2, flags + " --device cuda", &r,
                                                  " --replica_check_every 1"));
    EXPECT_TRUE(contains(r.multi_output, "ranks=2")) << r.multi_output;
    for (const char* prefix : {"param/", "buffer/"}) {
      auto pa = final_params(r.single, prefix), pb = final_params(r.multi, prefix);
      ASSERT_EQ(pa.size(), pb.size()) << name << " " << prefix;
      const double worst = max_difference(pa, pb);
      EXPECT_LT(worst, 1e-5) << name << ": max |delta " << prefix << "| " << worst;
    }
  }
}

TEST_F(CliMpi, RanksWithDifferentFlagsFailNamingTheRank) {
  const std::string out = dir("mismatch");
  auto r = run_command(mpirun() + " -np 1 " + seqrec_bin() + train_args(data(), out, 8) + " --lr 0.001 : -np 1 " +
                           seqrec_bin() + train_args(data(), out, 8) + " --lr 0.002",
                       60);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "hung";
  EXPECT_TRUE(contains(r.output, "rank 1")) << r.output;
  EXPECT_TRUE(contains(r.output, "lr=0.002")) << r.output;
}

// Ranks of one job must run one build: a rank started from another binary (here a copy of
// seqrec that names another revision) fails the job before anything is trained, naming both.
TEST_F(CliMpi, RanksOfAnotherBuildFailNamingTheRank) {
  std::string why;
  const std::string other_bin = dir("seqrec-other-build");
  const std::string other = copy_as_another_build(other_bin, &why);
  ASSERT_FALSE(other.empty()) << why;
  const std::string out = dir("mixed-builds");
  auto r = run_command(mpirun() + " -np 1 " + seqrec_bin() + train_args(data(), out, 8) + " : -np 1 " + other_bin +
                           train_args(data(), out, 8),
                       60);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "hung";
  EXPECT_TRUE(contains(r.output, "rank 1 runs a different configuration from rank 0: 'build: seqrec " +
                                     revision_of(seqrec_bin()) + " (")) << r.output;
  EXPECT_TRUE(contains(r.output, "'build: seqrec " + other + " (")) << r.output;
  EXPECT_FALSE(fs::exists(out + "/checkpoints")) << "nothing may be trained";
}

// A rank whose state drifts from the others' (here injected: SEQREC_FAULT_DIVERGE makes one
// rank nudge one tensor after one update) stops the job at the next replica check with the
// tensor and the rank named, and never reaches a checkpoint: the one before stays complete.
TEST_F(CliMpi, ADivergedRankStopsTheRunNamingTheTensor) {
  // Routing's EMA sums (a buffer, not a parameter): the centroids derived from them diverge.
  const std::string routing = dir("diverge-routing");
  auto a = run_command("env SEQREC_FAULT_DIVERGE=1:4:block1.attn.ema_sum " + mpirun() + " -np 2 " + seqrec_bin() +
                           train_args(data(), routing, 8) +
                           " --model routing --routing_clusters 3 --routing_window 3 --max_steps 12 --replica_check_every 3",
                       120);
  EXPECT_NE(a.code, 0) << a.output;
  EXPECT_NE(a.code, 124) << "hung:\n" << a.output;
  EXPECT_TRUE(contains(a.output, "rank 1 perturbs 'block1.attn.ema_sum' after step 4")) << a.output;
  EXPECT_TRUE(contains(a.output, "replica check at step 6: 'block1.attn.centroids' differs across ranks (rank(s) 1"))
      << a.output;
  EXPECT_TRUE(contains(a.output, "replicas have diverged")) << a.output;

  // Periodic checks off: the check before each checkpoint still catches it, and the run's last
  // checkpoint (step 4) is left whole, with nothing of step 6 written.
  const std::string run = dir("diverge-ckpt");
  auto b = run_command("env SEQREC_FAULT_DIVERGE=1:5 " + mpirun() + " -np 2 " + seqrec_bin() + train_args(data(), run, 8) +
                           " --max_steps 12 --replica_check_every 0 --checkpoint_every 2",
                       120);
  EXPECT_NE(b.code, 0) << b.output;
  EXPECT_NE(b.code, 124) << "hung:\n" << b.output;
  EXPECT_TRUE(contains(b.output, "replica check before the checkpoint at step 6: 'item_emb.weight' differs")) << b.output;
  std::vector<std::string> entries;
  for (auto& e : fs::directory_iterator(run + "/checkpoints")) entries.push_back(e.path().filename().string());
  std::sort(entries.begin(), entries.end());
  ASSERT_FALSE(entries.empty());
  EXPECT_EQ(entries.back(), "step-000000000004");
  for (auto& e : entries) EXPECT_EQ(e.rfind("step-", 0), 0u) << "left behind: " << e;
  auto r = run_seqrec("info --checkpoint " + run + "/checkpoints/step-000000000004", 60);
  EXPECT_EQ(r.code, 0) << r.output;

  // A malformed value is an error, not silently nothing.
  auto c = run_command("env SEQREC_FAULT_DIVERGE=one:4 " + seqrec_bin() + train_args(data(), dir("diverge-bad"), 8), 60);
  EXPECT_NE(c.code, 0);
  EXPECT_TRUE(contains(c.output, "SEQREC_FAULT_DIVERGE='one:4': expected RANK:STEP[:NAME]")) << c.output;
  // So are a tensor the model does not have and a rank the job does not have.
  auto d = run_command("env SEQREC_FAULT_DIVERGE=0:4:block9.nothing " + seqrec_bin() +
                           train_args(data(), dir("diverge-name"), 8),
                       60);
  EXPECT_NE(d.code, 0);
  EXPECT_TRUE(contains(d.output, "the model has no parameter or buffer 'block9.nothing'")) << d.output;
  auto e = run_command("env SEQREC_FAULT_DIVERGE=2:4 " + seqrec_bin() + train_args(data(), dir("diverge-rank"), 8), 60);
  EXPECT_NE(e.code, 0);
  EXPECT_TRUE(contains(e.output, "SEQREC_FAULT_DIVERGE: rank 2 is not among the 1 rank(s)")) << e.output;
}

TEST_F(CliMpi, ADeadRankEndsTheJob) {
  const std::string out = dir("dead");
  // Rank 1 is killed while the job trains for many epochs (a second after the run's log shows
  // its set-up, however long start-up takes on a loaded machine; the watcher gives up if the rank
  // ends first, so a run that fails early leaves no process behind); mpirun must end every rank.
  const std::string cmd = mpirun() + " -np 2 sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then (until grep -qs " +
                          "\"model selection\" " + out + "/train.log || ! kill -0 $$ 2>/dev/null; do sleep 0.2; done; " +
                          "sleep 1; kill -9 $$ 2>/dev/null) & fi; exec " +
                          seqrec_bin() + " train --data " + data() + " --out " + out +
                          " --max_len 16 --hidden 16 --batch_size 8 --epochs 100000 --threads 1 --log_every 1000'";
  auto r = run_command(cmd, 120);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "the job hung after a rank died:\n" << r.output;
  // It was training when the rank died (not failing for some other reason first).
  EXPECT_TRUE(contains(r.output, "[setup] model selection")) << r.output;
  EXPECT_FALSE(contains(r.output, "[done]")) << r.output;
}

}  // namespace
