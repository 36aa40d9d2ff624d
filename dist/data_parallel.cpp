#include "dist/data_parallel.h"

#include <torch/torch.h>

#include <stdexcept>

#include "dist/comm.h"

namespace seqrec::dist {
namespace {

// Groups consecutive tensors of one dtype into buckets of at most kBucketBytes (a larger
// tensor forms its own bucket), packs each, runs `collective` on it, and unpacks.
template <typename F>
void bucketed(std::vector<at::Tensor>& tensors, F&& collective) {
  torch::NoGradGuard no_grad;
  size_t i = 0;
  while (i < tensors.size()) {
    size_t j = i;
    int64_t bytes = 0;
    const auto dtype = tensors[i].scalar_type();
    while (j < tensors.size() && tensors[j].scalar_type() == dtype &&
           (j == i || bytes + tensors[j].numel() * tensors[j].element_size() <= kBucketBytes)) {
      bytes += tensors[j].numel() * tensors[j].element_size();
      ++j;
    }
    std::vector<at::Tensor> flat;
    for (size_t k = i; k < j; ++k) flat.push_back(tensors[k].reshape({-1}));
    auto bucket = torch::cat(flat);
    collective(bucket);
    int64_t off = 0;
    for (size_t k = i; k < j; ++k) {
      const int64_t n = tensors[k].numel();
      tensors[k].copy_(bucket.narrow(0, off, n).view(tensors[k].sizes()));
      off += n;
    }
    i = j;
  }
}

}  // namespace

void all_reduce_sum_(Comm& comm, std::vector<at::Tensor>& tensors) {
  if (comm.size() == 1) return;
  bucketed(tensors, [&](at::Tensor& b) { comm.all_reduce(b, ReduceOp::kSum); });
}

void all_reduce_mean_(Comm& comm, std::vector<at::Tensor>& tensors) {
  if (comm.size() == 1) return;
  bucketed(tensors, [&](at::Tensor& b) {
    comm.all_reduce(b, ReduceOp::kSum);
    b.div_(comm.size());
  });
}

void broadcast_parameters(Comm& comm, std::vector<at::Tensor>& tensors, int root) {
  if (comm.size() == 1) return;
  bucketed(tensors, [&](at::Tensor& b) { comm.broadcast(b, root); });
}

uint64_t tensor_hash(const at::Tensor& t) {
  // FNV-1a over dtype, shape and the contiguous bytes: not cryptographic, but any difference
  // in a replica's state shows with probability 1 - 2^-64.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  const auto dtype = static_cast<int64_t>(t.scalar_type());
  mix(reinterpret_cast<const unsigned char*>(&dtype), sizeof dtype);
  for (const int64_t s : t.sizes()) mix(reinterpret_cast<const unsigned char*>(&s), sizeof s);
  auto c = t.detach().to(at::kCPU).contiguous();
  mix(static_cast<const unsigned char*>(c.data_ptr()), c.numel() * c.element_size());
  return h;
}

void check_replicas_identical(Comm& comm, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::string& when) {
  if (comm.size() == 1 || tensors.empty()) return;
  auto mine = torch::empty({static_cast<int64_t>(tensors.size())}, torch::kInt64);
  for (size_t i = 0; i < tensors.size(); ++i)
    mine[static_cast<int64_t>(i)] = static_cast<int64_t>(tensor_hash(tensors[i].second));
  const auto all = comm.all_gather(mine);  // [size, n]: every rank decides the same
  const auto differs = all.ne(all[0].unsqueeze(0)).any(0);
  if (!differs.any().item<bool>()) return;
  const int64_t first = differs.nonzero()[0][0].item<int64_t>();
  std::string ranks;
  for (int r = 1; r < comm.size(); ++r)
    if (all[r][first].item<int64_t>() != all[0][first].item<int64_t>()) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  throw std::runtime_error("replica check " + when + ": '" + tensors[first].first +
                           "' differs across ranks (rank(s) " + ranks + " differ from rank 0; " +
                           std::to_string(differs.sum().item<int64_t>()) +
                           " tensor(s) differ in all): data-parallel replicas have diverged");
}

}  // namespace seqrec::dist
