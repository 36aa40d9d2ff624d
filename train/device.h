#pragma once
// Where a run's model and batches live: the CPU, or one CUDA device. Everything here works
// against a LibTorch without CUDA too (then only "cpu" is accepted, with a message saying why).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace seqrec::train {

// --device in two steps (the trainer then picks a rank's device from the name, the local rank
// and the device count): the name, "cpu", "cuda" (device 0) or "cuda:N", then whether this
// process can use it. Each throws
// std::invalid_argument naming the problem: a malformed name; a LibTorch built without CUDA,
// no visible device, N out of range.
at::Device parse_device_name(const std::string& text);
void check_device_usable(const at::Device& device, const std::string& text);
// Makes a CUDA device this process's current one (where tensors made without an index go);
// nothing for the CPU.
void use_device(const at::Device& device);

// The default generator of a CUDA device (dropout and other in-model randomness there); no-ops
// and an undefined state on the CPU, whose generator the trainer keeps itself.
void seed_device_generator(const at::Device& device, uint64_t seed);
at::Tensor device_generator_state(const at::Device& device);
void set_device_generator_state(const at::Device& device, const at::Tensor& state);

// Peak of the memory allocated through the CUDA caching allocator on `device` since the last
// reset, in MiB (torch.cuda.max_memory_allocated: tensors only, the allocator's cache and the
// CUDA context aside); 0 on the CPU.
double device_peak_mib(const at::Device& device);
void reset_device_peak(const at::Device& device);

// The machine a sitting ran on, so that its times can be read with it: "host vm, CPU Intel(R)
// Xeon(R) Processor (2 logical cores)", and for a CUDA device ", GPU NVIDIA H100 80GB HBM3 (79.1
// GiB)". The CPU's name is /proc/cpuinfo's first "model name" ("unknown" where there is none).
std::string describe_machine(const at::Device& device);

}  // namespace seqrec::train
