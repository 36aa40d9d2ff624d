#pragma once
// The softmax loss's row passes on the CPU, fused (softmax_loss_fused.cpp): where ATen's
// reference takes five passes over a [n, N + 1] chunk of logits for its softmax (amax, sub, exp,
// sum, div) and two for the gradient (scatter, mul), each of these walks a row once while it sits
// in the cache. Only for contiguous float or double rows on the CPU (softmax_rows_fusable); exp
// is ops/exp_nonpositive.h's polynomial for float (within 2 ulp of std::exp; an argument below
// -87 gives exp(-87), a probability below 2e-38 that the reference would make smaller still) and
// std::exp for double.
#include <ATen/core/Tensor.h>

namespace seqrec::ops::detail {

bool softmax_rows_fusable(const at::Tensor& logits);

// Each row of logits [n, C] becomes its softmax in place, exp(x - max) · (1 / sum) with -inf
// entries exactly 0; norm [n, 2] (same dtype) receives each row's maximum and sum, so that the
// row's log-normaliser is max + log(sum).
void softmax_rows_fused(const at::Tensor& logits, const at::Tensor& norm);

// d(loss · g)/d(logits) in place of the rows: (p - onehot(target)) · g, where p is the row's
// softmax. With norm defined, p is first recomputed from the logits in the rows and norm (the
// forward's maxima and sums), bit for bit what softmax_rows_fused wrote; otherwise the rows hold
// p already. targets [n] int64 (columns), g a scalar of the rows' dtype.
void softmax_grad_rows_fused(const at::Tensor& rows, const at::Tensor& norm, const at::Tensor& targets,
                             const at::Tensor& g);

}  // namespace seqrec::ops::detail
