#pragma once
// Argument checks shared by the op references (ATen only). Each throws c10::Error naming the
// argument. Also what the fused ops ask before building an autograd node (grad_wanted).
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <initializer_list>

namespace seqrec::ops::detail {

// key_padding must be bool [B, L].
inline void check_key_padding(const at::Tensor& key_padding, int64_t B, int64_t L) {
  TORCH_CHECK(key_padding.dim() == 2 && key_padding.size(0) == B && key_padding.size(1) == L &&
                  key_padding.scalar_type() == at::kBool,
              "key_padding must be bool [B, L] = [", B, ", ", L, "]; got ", key_padding.sizes(), " ",
              key_padding.scalar_type());
}

// Whether autograd will ask for a gradient of any of `inputs`.
inline bool grad_wanted(std::initializer_list<at::Tensor> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const auto& t : inputs)
    if (t.requires_grad()) return true;
  return false;
}

}  // namespace seqrec::ops::detail
