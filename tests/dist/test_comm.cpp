// Comm collectives with exact answers (ones * (rank + 1)), run as 1 process and under
// mpirun -np 2 / 3. Collectives come before assertions so a failing rank never strands the
// others in a collective.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dist/comm.h"
#include "dist/data_parallel.h"

namespace {
using namespace seqrec::dist;

Comm& comm() {
  static std::unique_ptr<Comm> c = make_comm("auto");
  return *c;
}

int64_t tri(int n) { return static_cast<int64_t>(n) * (n + 1) / 2; }  // sum of rank+1

TEST(Comm, AllReduceEveryDtypeAndOp) {
  const int r = comm().rank(), n = comm().size();
  for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kInt32, torch::kInt64, torch::kUInt8}) {
    auto sum = torch::ones({7, 3}, dtype) * (r + 1);
    auto mx = torch::ones({5}, dtype) * (r + 1);
    auto mn = torch::ones({5}, dtype) * (r + 1);
    comm().all_reduce(sum, ReduceOp::kSum);
    comm().all_reduce(mx, ReduceOp::kMax);
    comm().all_reduce(mn, ReduceOp::kMin);
    EXPECT_TRUE(torch::equal(sum, torch::full({7, 3}, tri(n), dtype))) << dtype;
    EXPECT_TRUE(torch::equal(mx, torch::full({5}, n, dtype))) << dtype;
    EXPECT_TRUE(torch::equal(mn, torch::ones({5}, dtype))) << dtype;
  }
  auto empty = torch::zeros({0});
  comm().all_reduce(empty);
  EXPECT_EQ(empty.numel(), 0);
}

TEST(Comm, BroadcastFromFirstAndLastRank) {
  const int r = comm().rank(), n = comm().size();
  for (int root : {0, n - 1}) {
    auto t = torch::arange(10, torch::kInt64) + 100 * r;
    comm().broadcast(t, root);
    EXPECT_TRUE(torch::equal(t, torch::arange(10, torch::kInt64) + 100 * root));
  }
}

TEST(Comm, AllGatherAndStrings) {
  const int r = comm().rank(), n = comm().size();
  auto g = comm().all_gather(torch::full({2, 2}, r, torch::kInt32));
  auto s = comm().all_gather_string(std::string(r + 1, static_cast<char>('a' + r)));
  auto b = comm().broadcast_string(r == 0 ? "from-zero" : "ignored", 0);
  ASSERT_EQ(g.size(0), n);
  for (int k = 0; k < n; ++k) {
    EXPECT_TRUE(torch::equal(g[k], torch::full({2, 2}, k, torch::kInt32)));
    EXPECT_EQ(s[k], std::string(k + 1, static_cast<char>('a' + k)));
  }
  EXPECT_EQ(b, "from-zero");
}

TEST(Comm, SameConfigPassesAndADifferentOneNamesTheRank) {
  const int r = comm().rank(), n = comm().size();
  EXPECT_NO_THROW(check_same_config(comm(), "lr=0.001\nmodel=sasrec\n"));
  if (n < 2) return;
  std::string mine = r == 1 ? "lr=0.002\nmodel=sasrec\n" : "lr=0.001\nmodel=sasrec\n";
  try {
    check_same_config(comm(), mine);
    ADD_FAILURE() << "rank " << r << " did not throw";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
    EXPECT_NE(m.find("lr=0.002"), std::string::npos) << m;
  }
}

TEST(DataParallel, BucketedSumMeanAndBroadcast) {
  const int r = comm().rank(), n = comm().size();
  // Odd shapes, mixed dtypes, one tensor larger than a bucket.
  std::vector<at::Tensor> ts = {torch::ones({3, 5}) * (r + 1), torch::ones({1}) * (r + 1),
                                torch::ones({(kBucketBytes / 4) + 17}) * (r + 1),
                                torch::ones({4}, torch::kFloat64) * (r + 1), torch::ones({0})};
  auto means = ts;
  for (auto& t : means) t = t.clone();
  all_reduce_sum_(comm(), ts);
  all_reduce_mean_(comm(), means);
  std::vector<at::Tensor> params = {torch::full({2, 3}, r), torch::full({9}, 2 * r)};
  broadcast_parameters(comm(), params, 0);
  for (size_t i = 0; i < ts.size(); ++i) {
    if (ts[i].numel() == 0) continue;
    EXPECT_EQ(ts[i].min().item<double>(), static_cast<double>(tri(n))) << i;
    EXPECT_EQ(ts[i].max().item<double>(), static_cast<double>(tri(n))) << i;
    EXPECT_DOUBLE_EQ(means[i].max().item<double>(), static_cast<double>(tri(n)) / n) << i;
  }
  EXPECT_EQ(params[0].abs().sum().item<double>(), 0.0);
  EXPECT_EQ(params[1].abs().sum().item<double>(), 0.0);
}

TEST(Comm, MakeCommRejectsUnknownBackend) { EXPECT_THROW(make_comm("carrier-pigeon"), std::invalid_argument); }

}  // namespace
