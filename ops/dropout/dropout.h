#pragma once
// Inverted dropout whose mask comes from a counter-based generator: one 64-bit draw from
// Torch's default generator seeds the call (so the dropout stream is part of the saved RNG
// state and resumes exactly), and element i's keep decision is a hash of (seed, i).
// On CPU this is several times cheaper than a Bernoulli draw per element.
#include <ATen/core/Tensor.h>

namespace seqrec::ops {

// x * mask / (1 - p) with mask ~ Bernoulli(1 - p); identity when !training or p == 0.
at::Tensor dropout(const at::Tensor& x, double p, bool training);

// One 64-bit draw from Torch's default CPU generator: the seed of one call's counter-based
// random bits (dropout masks, Top-K attention dropout, MoE gating noise), so that they are
// part of the saved RNG state.
uint64_t random_seed();

// The scaled keep mask (values 0 or 1/(1-p)) for `seed`, shaped like `like`. Exposed for tests.
at::Tensor dropout_mask(const at::Tensor& like, double p, uint64_t seed);

}  // namespace seqrec::ops
