#include "dist/autograd.h"

#include <torch/torch.h>

namespace seqrec::dist {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Comm::all_to_all on CPU rows: a multi-rank exchange of device rows goes through the host.
at::Tensor exchange(Comm& comm, const at::Tensor& send, const std::vector<int64_t>& send_counts,
                    std::vector<int64_t>* recv_counts) {
  if (comm.size() == 1 || send.device().is_cpu()) return comm.all_to_all(send.contiguous(), send_counts, recv_counts);
  auto out = comm.all_to_all(send.to(at::kCPU).contiguous(), send_counts, recv_counts);
  return out.to(send.device());
}

struct AllToAll : public torch::autograd::Function<AllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& send, Comm* comm,
                            const std::vector<int64_t>& send_counts, std::vector<int64_t>* recv_counts) {
    std::vector<int64_t> received;
    auto out = exchange(*comm, send, send_counts, &received);
    ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(comm));
    ctx->saved_data["recv_counts"] = received;
    if (recv_counts) *recv_counts = std::move(received);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* comm = reinterpret_cast<Comm*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
    const auto received = ctx->saved_data["recv_counts"].toIntVector();
    // Custom functions materialise undefined gradients as zeros, so grads[0] is defined.
    auto back = exchange(*comm, grads[0].contiguous(), received, nullptr);
    return {back, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor all_to_all_differentiable(Comm& comm, const at::Tensor& send, const std::vector<int64_t>& send_counts,
                                     std::vector<int64_t>* recv_counts) {
  return AllToAll::apply(send, &comm, send_counts, recv_counts);
}

}  // namespace seqrec::dist
