#pragma once
// Slicing a left-padded batch by row length: the rows sorted longest first, cut into up to
// `groups` runs of consecutive rows, each run trimmed to the columns its longest row uses.
// Rows are independent in every model here, so running each slice on its own changes nothing
// but the work (the quadratic part falls to sum over slices of rows x width^2). Shared by the
// trainer (whole-model slices) and ops::gated_attention_by_length (FLASH4Rec, whose mixture of
// experts needs the batch whole).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace seqrec::ops {

struct LengthSlice {
  at::Tensor rows;  // [n] int64 row indices (a view of LengthSlices::order), longest first
  int64_t width;    // the longest row's length: the slice keeps the last `width` columns
};

struct LengthSlices {
  at::Tensor order;                 // [B] int64: every row, by descending length (stable)
  std::vector<LengthSlice> slices;  // consecutive runs of `order`, none of width 0
  int64_t covered = 0;              // rows in some slice; order[covered:] all have length 0
  int64_t shortest = 0;             // the shortest row's length
};

// lengths: [B] int64 real lengths on any device (read through one host copy). groups <= 1 gives
// one slice. Each slice holds ceil(B / groups) rows except the last.
LengthSlices slice_by_length(const at::Tensor& lengths, int64_t groups);

// The last `width` columns of t's rows `rows` along dimension `dim` (the slots a left-padded
// slice keeps).
at::Tensor take_slice(const at::Tensor& t, const LengthSlice& slice, int64_t dim);

// inverse[order[i]] = i: index_select(0, inverse) on rows stacked in `order` puts them back in
// batch order.
at::Tensor inverse_order(const at::Tensor& order);

}  // namespace seqrec::ops
