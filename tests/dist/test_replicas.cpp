// The cross-rank replica check: identical state passes, one rank's perturbed tensor is
// named on every rank. Run as 1 process and under mpirun -np 2 / 3; every rank reaches every
// collective before any assertion.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "dist/comm.h"
#include "dist/data_parallel.h"

namespace {
using namespace seqrec::dist;
using Named = std::vector<std::pair<std::string, at::Tensor>>;

Comm& comm() {
  static std::unique_ptr<Comm> c = make_comm("auto");
  return *c;
}

Named state() {
  return {{"item_emb.weight", torch::arange(12, torch::kFloat32).view({3, 4})},
          {"block0.attn.centroids", torch::linspace(-1, 1, 10, torch::kFloat64).view({2, 5})},
          {"block0.attn.ema_count", torch::ones({2}, torch::kFloat32)}};
}

std::string check(const Named& s) {
  try {
    check_replicas_identical(comm(), s, "at step 7");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(Replicas, HashSeesEveryBitShapeAndDtype) {
  auto a = torch::arange(6, torch::kFloat32);
  auto b = a.clone();
  EXPECT_EQ(tensor_hash(a), tensor_hash(b));
  b[3] = std::nextafter(3.0f, 4.0f);
  EXPECT_NE(tensor_hash(a), tensor_hash(b));
  EXPECT_NE(tensor_hash(a), tensor_hash(a.view({2, 3})));
  EXPECT_NE(tensor_hash(torch::zeros({4}, torch::kInt32)), tensor_hash(torch::zeros({4}, torch::kFloat32)));
  // Non-contiguous views hash their values, not their storage.
  auto m = torch::arange(12, torch::kFloat32).view({3, 4});
  EXPECT_EQ(tensor_hash(m.t()), tensor_hash(m.t().contiguous()));
}

TEST(Replicas, IdenticalStatePasses) { EXPECT_EQ(check(state()), ""); }

TEST(Replicas, ADivergedRankIsNamedOnEveryRank) {
  const int r = comm().rank(), n = comm().size();
  auto s = state();
  // The last rank's centroids move by one ulp: the kind of drift a rank that skipped an EMA
  // all-reduce would show.
  if (r == n - 1 && n > 1) {
    auto& c = s[1].second;
    c[1][2] = std::nextafter(c[1][2].item<double>(), 2.0);
  }
  const std::string msg = check(s);
  if (n == 1) {
    EXPECT_EQ(msg, "");  // nothing to compare against
  } else {
    EXPECT_NE(msg.find("'block0.attn.centroids'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank(s) " + std::to_string(n - 1) + " differ from rank 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("at step 7"), std::string::npos) << msg;
  }
}

}  // namespace
