#pragma once
// Argument checks shared by the op references (ATen only). Each throws c10::Error naming the
// argument.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace seqrec::ops::detail {

// key_padding must be bool [B, L].
inline void check_key_padding(const at::Tensor& key_padding, int64_t B, int64_t L) {
  TORCH_CHECK(key_padding.dim() == 2 && key_padding.size(0) == B && key_padding.size(1) == L &&
                  key_padding.scalar_type() == at::kBool,
              "key_padding must be bool [B, L] = [", B, ", ", L, "]; got ", key_padding.sizes(), " ",
              key_padding.scalar_type());
}

}  // namespace seqrec::ops::detail
