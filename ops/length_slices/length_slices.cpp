#include "ops/length_slices/length_slices.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace seqrec::ops {

LengthSlices slice_by_length(const at::Tensor& lengths, int64_t groups) {
  TORCH_CHECK(lengths.dim() == 1 && lengths.scalar_type() == at::kLong, "lengths must be int64 [B]; got ",
              lengths.sizes(), " ", lengths.scalar_type());
  LengthSlices out;
  const int64_t B = lengths.size(0);
  out.order = std::get<1>(at::sort(lengths, /*stable=*/true, /*dim=*/0, /*descending=*/true));
  if (B == 0) return out;
  // The slice bounds are read on the host (one small copy when the batch lives on a GPU).
  auto lengths_host = lengths.cpu(), order_host = out.order.cpu();
  const auto* len = lengths_host.data_ptr<int64_t>();
  const auto* ord = order_host.data_ptr<int64_t>();
  out.shortest = len[ord[B - 1]];
  const int64_t per = (B + std::max<int64_t>(groups, 1) - 1) / std::max<int64_t>(groups, 1);
  for (int64_t begin = 0; begin < B; begin += per) {
    const int64_t width = len[ord[begin]];
    if (width == 0) break;  // this row and every later one are empty
    const int64_t n = std::min(per, B - begin);
    out.slices.push_back({out.order.narrow(0, begin, n), width});
    out.covered = begin + n;
  }
  return out;
}

at::Tensor take_slice(const at::Tensor& t, const LengthSlice& slice, int64_t dim) {
  const int64_t L = t.size(dim);
  TORCH_CHECK(slice.width <= L, "a slice of width ", slice.width, " does not fit ", L, " columns");
  return t.index_select(0, slice.rows).narrow(dim, L - slice.width, slice.width);
}

at::Tensor inverse_order(const at::Tensor& order) {
  auto inverse = at::empty_like(order);
  inverse.index_put_({order}, at::arange(order.size(0), order.options()));
  return inverse;
}

}  // namespace seqrec::ops
