#include "dist/data_parallel.h"

#include <torch/torch.h>

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

}  // namespace seqrec::dist
