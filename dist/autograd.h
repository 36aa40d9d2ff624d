#pragma once
// Differentiable collectives: the communication steps of expert-parallel MoE as autograd
// functions, so that the backward pass moves gradients back along the same routes.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "dist/comm.h"

namespace seqrec::dist {

// Comm::all_to_all (same arguments, except that `send` need not be contiguous; same result)
// recorded on the autograd tape: the gradient of `send` is the all-to-all of the incoming
// gradient with the counts reversed (every rank sends back, to each rank r, the gradient rows
// of the rows it received from r), so row i of `send` receives exactly the gradient of the row
// it became on its destination.
//
// Collective in both directions:
// - forward: every rank of `comm` calls it (with its own counts; a rank may send and receive
//   nothing, send then has 0 rows), in the same order;
// - backward: every rank of `comm` must run the backward of every such call, in the same order.
//   This holds when all ranks run the same graph (the same layers, then backward of a loss that
//   depends on every call's output the same way on every rank). It does not hold when a rank
//   prunes the node (torch::autograd::grad with inputs that skip it, `send` not requiring grad
//   on one rank only, a rank that skips backward): the other ranks then block in the exchange.
//   An undefined incoming gradient (the output did not reach the loss) is sent as zeros, so a
//   node that runs always takes part.
// If `send` does not require grad, no backward node is recorded (on any rank that agrees).
// Tensors on another device than the CPU are copied to the CPU for a multi-rank exchange and
// the result comes back on the device of `send`. `comm` must outlive the graph.
// Errors: as Comm::all_to_all (std::invalid_argument).
at::Tensor all_to_all_differentiable(Comm& comm, const at::Tensor& send, const std::vector<int64_t>& send_counts,
                                     std::vector<int64_t>* recv_counts = nullptr);

}  // namespace seqrec::dist
