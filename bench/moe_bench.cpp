// Mixture-of-experts layer throughput (forward + backward) at 1, 2, 3 ranks: the layer of
// models/moe.h with its experts spread over every rank (expert parallelism), each rank feeding
// --tokens tokens. Run under mpirun (bench/moe_scaling.sh); rank 0 prints one JSON line.
//   moe_bench [--tokens 4096] [--dim 64] [--inner 256] [--experts 6] [--top_k 1] [--capacity 1.25] [--iters 5]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "models/moe.h"

int main(int argc, char** argv) {
  int64_t tokens = 4096, dim = 64, inner = 256, experts = 6, top_k = 1, iters = 5;
  double capacity = 1.25;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--tokens") tokens = std::atoll(v.c_str());
    else if (a == "--dim") dim = std::atoll(v.c_str());
    else if (a == "--inner") inner = std::atoll(v.c_str());
    else if (a == "--experts") experts = std::atoll(v.c_str());
    else if (a == "--top_k") top_k = std::atoll(v.c_str());
    else if (a == "--capacity") capacity = std::atof(v.c_str());
    else if (a == "--iters") iters = std::atoll(v.c_str());
    else {
      std::fprintf(stderr, "moe_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  auto comm = seqrec::dist::make_comm("auto");
  torch::manual_seed(1 + comm->rank());
  seqrec::models::MoeOptions o;
  o.dim = dim;
  o.inner = inner;
  o.experts = experts;
  o.top_k = top_k;
  o.capacity_factor = capacity;
  o.world = comm.get();
  o.ep = comm.get();
  seqrec::models::MoeFeedForward moe(o);
  moe->train(true);
  auto x = torch::randn({tokens, dim}).requires_grad_(true);
  std::vector<double> ms;
  for (int64_t i = 0; i <= iters; ++i) {  // the first pass warms up
    comm->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    auto y = moe->forward(x);
    (y.sum() + moe->take_auxiliary_loss()).backward();
    comm->barrier();
    const auto t1 = std::chrono::steady_clock::now();
    if (i > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    x.mutable_grad() = at::Tensor();
    for (auto& p : moe->parameters()) p.mutable_grad() = at::Tensor();
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  if (comm->rank() == 0)
    std::printf("{\"ranks\":%d,\"tokens_per_rank\":%lld,\"dim\":%lld,\"inner\":%lld,\"experts\":%lld,\"top_k\":%lld,"
                "\"threads\":%d,\"ms\":%.2f,\"tokens_per_s\":%.0f}\n",
                comm->size(), static_cast<long long>(tokens), static_cast<long long>(dim),
                static_cast<long long>(inner), static_cast<long long>(experts), static_cast<long long>(top_k),
                at::get_num_threads(), median, comm->size() * tokens / (median / 1000.0));
  return 0;
}
