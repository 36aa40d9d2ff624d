// Comm collectives with exact answers (ones * (rank + 1)), run as 1 process and under
// mpirun -np 2 / 3. Collectives come before assertions so a failing rank never strands the
// others in a collective.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dist/comm.h"
#include "dist/data_parallel.h"

#include <climits>
#include <limits>
#include <numeric>

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

// all_to_all: rank 1 sends nothing at all, rank 2 sends nothing to rank 1, everyone else a
// rank- and destination-dependent count; a 3-process matrix (row = source) is
// [1 2 3; 0 0 0; 3 0 1], 2 processes [1 2; 0 0], 1 process [1].
int64_t a2a_count(int src, int dst) { return src == 1 ? 0 : (3 * src + dst + 1) % 4; }

// The rows rank `src` sends to rank `dst`: each element encodes (source, destination, row,
// flat column) as src*1000 + dst*100 + row*10 + col, plus `base` (to use int64's high bits).
at::Tensor a2a_block(int src, int dst, c10::IntArrayRef trailing, int64_t base) {
  std::vector<int64_t> shape{a2a_count(src, dst)};
  shape.insert(shape.end(), trailing.begin(), trailing.end());
  const int64_t cols = c10::multiply_integers(trailing);
  auto row = torch::arange(shape[0], torch::kInt64).view({-1, 1}) * 10;
  auto col = torch::arange(cols, torch::kInt64).view({1, -1});
  return (row + col + (base + src * 1000 + dst * 100)).view(shape);
}

std::vector<int64_t> a2a_send_counts(int src, int n) {
  std::vector<int64_t> c;
  for (int d = 0; d < n; ++d) c.push_back(a2a_count(src, d));
  return c;
}

// What rank `me` sends (blocks for destinations 0..n-1) and what it must receive (blocks from
// sources 0..n-1), in `dtype`.
at::Tensor a2a_send(int me, int n, c10::IntArrayRef trailing, int64_t base, at::ScalarType dtype) {
  std::vector<at::Tensor> blocks;
  for (int d = 0; d < n; ++d) blocks.push_back(a2a_block(me, d, trailing, base));
  return torch::cat(blocks).to(dtype).contiguous();
}
at::Tensor a2a_expected(int me, int n, c10::IntArrayRef trailing, int64_t base, at::ScalarType dtype) {
  std::vector<at::Tensor> blocks;
  for (int s = 0; s < n; ++s) blocks.push_back(a2a_block(s, me, trailing, base));
  return torch::cat(blocks).to(dtype).contiguous();
}

TEST(Comm, AllToAllSendsEachRowToItsRank) {
  const int r = comm().rank(), n = comm().size();
  struct Case {
    at::ScalarType dtype;
    std::vector<int64_t> trailing;
    int64_t base;
  };
  // float32 (2-D), int64 with values beyond 2^32 (2-D) and a 3-D float32 tensor.
  const std::vector<Case> cases = {
      {torch::kFloat32, {3}, 0}, {torch::kInt64, {4}, int64_t{1} << 40}, {torch::kFloat32, {2, 3}, 0}};
  std::vector<at::Tensor> sent, got;
  std::vector<std::vector<int64_t>> got_counts(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    sent.push_back(a2a_send(r, n, c.trailing, c.base, c.dtype));
    got.push_back(comm().all_to_all(sent.back(), a2a_send_counts(r, n), &got_counts[i]));
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    std::vector<int64_t> want_counts;
    for (int s = 0; s < n; ++s) want_counts.push_back(a2a_count(s, r));
    EXPECT_EQ(got_counts[i], want_counts) << "case " << i << " rank " << r;
    const auto want = a2a_expected(r, n, c.trailing, c.base, c.dtype);
    EXPECT_EQ(got[i].scalar_type(), c.dtype) << "case " << i;
    EXPECT_EQ(got[i].sizes().vec(), want.sizes().vec()) << "case " << i << " rank " << r;
    EXPECT_TRUE(got[i].sizes() == want.sizes() && torch::equal(got[i], want))
        << "case " << i << " rank " << r << "\ngot\n" << got[i] << "\nwant\n" << want;
  }
}

// The codes of a2a_send/a2a_expected in `dtype`, made inexact (x 1.0001) for the floating
// types so that a byte-exact round trip is a meaningful check; only well-defined conversions
// (int64 wraps to the narrower integers, in-range values to the 16-bit floats).
at::Tensor in_dtype(const at::Tensor& codes, at::ScalarType dtype) {
  if (at::isFloatingType(dtype)) return codes.to(torch::kFloat64).mul(1.0001).to(dtype).contiguous();
  return codes.to(dtype).contiguous();
}

TEST(Comm, AllToAllRoundTripIsExactForEveryDtype) {
  // MoE combine: sending the received rows back with the received counts restores the input.
  const int r = comm().rank(), n = comm().size();
  const std::vector<at::ScalarType> dtypes = {torch::kFloat32, torch::kFloat64, torch::kInt32, torch::kInt64,
                                              torch::kUInt8,   torch::kBool,    torch::kBFloat16, torch::kFloat16};
  std::vector<at::Tensor> sent, there, back;
  std::vector<std::vector<int64_t>> there_counts(dtypes.size()), back_counts(dtypes.size());
  for (size_t i = 0; i < dtypes.size(); ++i) {
    sent.push_back(in_dtype(a2a_send(r, n, {2, 5}, 0, torch::kInt64), dtypes[i]));
    there.push_back(comm().all_to_all(sent[i], a2a_send_counts(r, n), &there_counts[i]));
    back.push_back(comm().all_to_all(there[i], there_counts[i], &back_counts[i]));
  }
  for (size_t i = 0; i < dtypes.size(); ++i) {
    const auto dtype = dtypes[i];
    const auto want_there = in_dtype(a2a_expected(r, n, {2, 5}, 0, torch::kInt64), dtype);
    EXPECT_TRUE(there[i].sizes() == want_there.sizes() && torch::equal(there[i], want_there)) << dtype << " rank " << r;
    EXPECT_EQ(back_counts[i], a2a_send_counts(r, n)) << dtype;
    EXPECT_EQ(back[i].scalar_type(), dtype);
    EXPECT_EQ(back[i].sizes().vec(), sent[i].sizes().vec()) << dtype;
    EXPECT_TRUE(back[i].sizes() == sent[i].sizes() && torch::equal(back[i], sent[i])) << dtype << " rank " << r;
  }
}

TEST(Comm, AllToAllEmptyRowsAndZeroWidthRows) {
  const int r = comm().rank(), n = comm().size();
  // Nobody sends anything: every rank receives [0, 3].
  std::vector<int64_t> none_counts;
  auto none = comm().all_to_all(torch::zeros({0, 3}), std::vector<int64_t>(n, 0), &none_counts);
  // Rows of zero bytes, [N, 0], with the usual counts: the counts still travel.
  std::vector<int64_t> flat_counts;
  auto flat = comm().all_to_all(torch::zeros({a2a_send(r, n, {1}, 0, torch::kFloat32).size(0), 0}),
                                a2a_send_counts(r, n), &flat_counts);
  // A 1-D tensor (scalar rows) with no recv_counts requested.
  auto one_d = comm().all_to_all(a2a_send(r, n, {1}, 0, torch::kInt32).view({-1}), a2a_send_counts(r, n));
  EXPECT_EQ(none.sizes().vec(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(none_counts, std::vector<int64_t>(n, 0));
  std::vector<int64_t> want_counts;
  for (int s = 0; s < n; ++s) want_counts.push_back(a2a_count(s, r));
  EXPECT_EQ(flat_counts, want_counts);
  const int64_t want_rows = std::accumulate(want_counts.begin(), want_counts.end(), int64_t{0});
  EXPECT_EQ(flat.sizes().vec(), (std::vector<int64_t>{want_rows, 0}));
  EXPECT_TRUE(torch::equal(one_d, a2a_expected(r, n, {1}, 0, torch::kInt32).view({-1}))) << one_d;
}

// Runs f, which must throw std::invalid_argument whose message contains `what`.
template <typename F>
void expect_invalid(F&& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one about '" << what << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(Comm, AllToAllRejectsBadArgumentsOnEveryRank) {
  // Every rank passes the same bad arguments, so each throws before communicating and none
  // is left waiting in the exchange.
  const int n = comm().size();
  auto rows = torch::zeros({4, 2});
  std::vector<int64_t> ok(n, 0);
  ok[0] = 4;
  auto a2a = [&](const at::Tensor& t, std::vector<int64_t> counts) { return comm().all_to_all(t, counts); };
  expect_invalid([&] { a2a(rows, std::vector<int64_t>(n + 1, 0)); }, "entries but there are");
  std::vector<int64_t> negative(n, 0);
  negative[n - 1] = -1;
  negative[0] = n > 1 ? 5 : -1;  // [5, 0.., -1] sums to the 4 rows: the sign alone is wrong
  expect_invalid([&] { a2a(rows, negative); }, "is negative");
  auto short_counts = ok;
  short_counts[0] = 3;
  expect_invalid([&] { a2a(rows, short_counts); }, "do not sum to the 4 rows");
  auto huge = ok;
  huge[0] = std::numeric_limits<int64_t>::max();  // must not overflow the sum into a match
  expect_invalid([&] { a2a(rows, huge); }, "do not sum");
  expect_invalid([&] { a2a(torch::zeros({2, 4}).t(), ok); }, "contiguous");
  expect_invalid([&] { a2a(at::Tensor(), ok); }, "undefined");
  expect_invalid([&] { a2a(torch::tensor(1.0f), ok); }, "0-dim");
  expect_invalid([&] { a2a(torch::zeros({4, 2}, torch::kComplexFloat), ok); }, "unsupported dtype");
  expect_invalid([&] { a2a(torch::zeros({4, 2}, torch::kInt16), ok); }, "unsupported dtype");
  // Still in step: a good call after the bad ones works.
  auto fine = comm().all_to_all(torch::ones({3, 2}), [&] {
    std::vector<int64_t> c(n, 0);
    c[n - 1] = 3;
    return c;
  }());
  EXPECT_EQ(fine.size(0), comm().rank() == n - 1 ? 3 * n : 0);
}

TEST(Comm, AllToAllRanksThatDisagreeAllThrow) {
  // A dtype or trailing shape that differs between ranks is seen by every rank in the count
  // exchange, so every rank throws (rather than some blocking in the data exchange).
  const int r = comm().rank(), n = comm().size();
  if (n < 2) return;
  std::vector<int64_t> counts(n, 1);
  expect_invalid([&] { comm().all_to_all(torch::zeros({n, 3}, r == 1 ? torch::kInt64 : torch::kFloat32), counts); },
                 "ranks disagree");
  expect_invalid([&] { comm().all_to_all(torch::zeros({n, 2, r == 0 ? 3 : 1}), counts); }, "ranks disagree");
  expect_invalid([&] { comm().all_to_all(torch::zeros({n, r == 0 ? 6 : 2, r == 0 ? 1 : 3}), counts); },
                 "ranks disagree");
}

TEST(Comm, AllToAllOverMpiCountLimitThrowsOnEveryRank) {
  // Row counts beyond INT_MAX cannot be expressed to MPI. The tensors are allocated but never
  // touched (1 byte rows, 1-2 GiB of address space per rank, no memory in use), and whether
  // allocation worked is agreed collectively so that every rank makes the same calls.
  const int r = comm().rank(), n = comm().size();
  if (n < 2) return;
  const int64_t too_many = int64_t{INT_MAX} + 1, half = int64_t{1} << 30;
  at::Tensor big, medium;
  auto ok = torch::ones({1}, torch::kInt32);
  try {
    big = torch::empty({too_many, 1}, torch::kUInt8);
    medium = torch::empty({half, 1}, torch::kUInt8);
  } catch (const std::exception&) {
    ok.zero_();
  }
  comm().all_reduce(ok, ReduceOp::kMin);
  if (ok.item<int>() == 0) GTEST_SKIP() << "cannot reserve 3 GiB of address space";
  // Rank 0 alone sends too many rows (to itself): every rank learns it from the counts.
  std::vector<int64_t> counts(n, 0);
  counts[r] = r == 0 ? too_many : 0;
  expect_invalid([&] { comm().all_to_all(r == 0 ? big : big.narrow(0, 0, 0), counts); }, "rank 0 sends");
  // Each rank sends 2^30 rows to rank 0: no sender is over the limit, but rank 0 would receive
  // n * 2^30 >= 2^31 rows, which only it knows.
  std::fill(counts.begin(), counts.end(), 0);
  counts[0] = half;
  expect_invalid([&] { comm().all_to_all(medium, counts); }, "would receive");
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

// Even and odd ranks form two groups; each group's collectives see only its members.
TEST(Comm, SplitFormsIndependentGroups) {
  const int r = comm().rank(), n = comm().size();
  auto group = comm().split(r % 2, r);
  auto sum = torch::ones({3}, torch::kInt64) * (r + 1);
  group->all_reduce(sum);
  auto gathered = group->all_gather(torch::full({1}, r, torch::kInt64));
  int64_t expect = 0, members = 0;
  for (int q = r % 2; q < n; q += 2) expect += q + 1, ++members;
  EXPECT_EQ(group->size(), members);
  EXPECT_EQ(group->rank(), r / 2);
  EXPECT_TRUE(torch::equal(sum, torch::full({3}, expect, torch::kInt64)));
  for (int64_t i = 0; i < members; ++i) EXPECT_EQ(gathered[i][0].item<int64_t>(), r % 2 + 2 * i);
  EXPECT_THROW(comm().split(-1, 0), std::invalid_argument);
}

TEST(Comm, MakeCommRejectsUnknownBackend) { EXPECT_THROW(make_comm("carrier-pigeon"), std::invalid_argument); }

}  // namespace
