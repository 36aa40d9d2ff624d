#pragma once
// Data-parallel helpers on top of Comm. Tensors are packed into flat buckets of at most
// kBucketBytes so that one collective moves many small tensors; the bucket is the unit that
// a later GPU path overlaps with backward (launch a bucket's reduction as soon as its last
// gradient is produced), which is why the API takes the tensor list rather than one buffer.
#include <ATen/core/Tensor.h>

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

}  // namespace seqrec::dist
