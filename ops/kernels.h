#pragma once
// Whether the ops run their fused kernels (the CPU's, and a CUDA device's where one exists) or
// their ATen references everywhere. On by default; `--fused_kernels=false` turns it off for a
// process, to check a model or time it through the references the kernels are tested against.
// Set once, before any op runs (it is read at every call, not synchronised with running ops).
namespace seqrec::ops {

void set_fused_kernels(bool on);
bool fused_kernels();

}  // namespace seqrec::ops
