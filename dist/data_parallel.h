#pragma once
// Data-parallel helpers on top of Comm. Tensors are packed into flat buckets of at most
// kBucketBytes so that one collective moves many small tensors; the bucket is the unit that
// a later GPU path overlaps with backward (launch a bucket's reduction as soon as its last
// gradient is produced), which is why the API takes the tensor list rather than one buffer.
#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace seqrec::dist {

class Comm;

inline constexpr int64_t kBucketBytes = 25 << 20;

// In place: every tensor becomes the sum over ranks.
void all_reduce_sum_(Comm& comm, std::vector<at::Tensor>& tensors);
// In place: every tensor becomes the mean over ranks.
void all_reduce_mean_(Comm& comm, std::vector<at::Tensor>& tensors);
// In place: every tensor takes root's values.
void broadcast_parameters(Comm& comm, std::vector<at::Tensor>& tensors, int root = 0);

// A 64-bit hash of a tensor's bytes (shape and dtype included): equal tensors hash equal on
// every rank, and a single flipped bit changes it.
uint64_t tensor_hash(const at::Tensor& t);

// Collective. State that must be identical on every rank (parameters, EMA centroids and
// codebooks) is hashed per tensor and compared with rank 0's; throws std::runtime_error on
// every rank, naming the first differing tensor and the ranks that hold another value, when
// any differs. Every rank passes the same names in the same order.
void check_replicas_identical(Comm& comm, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::string& when);

}  // namespace seqrec::dist
