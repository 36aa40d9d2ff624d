#include "train/device.h"

#include <torch/torch.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "seqrec_config.h"
#if SEQREC_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace seqrec::train {

at::Device parse_device_name(const std::string& text) {
  const std::string usage = "--device '" + text + "': expected cpu, cuda or cuda:N";
  if (text == "cpu") return at::Device(at::kCPU);
  if (text.rfind("cuda", 0) != 0) throw std::invalid_argument(usage);
  int64_t index = 0;
  if (text.size() > 4) {
    if (text[4] != ':' || text.size() == 5) throw std::invalid_argument(usage);
    for (size_t i = 5; i < text.size(); ++i)
      if (text[i] < '0' || text[i] > '9' || i > 7) throw std::invalid_argument(usage);
    index = std::stoll(text.substr(5));
    if (index > 127) throw std::invalid_argument(usage + " (N < 128)");  // c10::DeviceIndex is 8 bits
  }
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

void check_device_usable(const at::Device& device, const std::string& text) {
  if (device.is_cpu()) return;
  if (!torch::cuda::is_available())
    throw std::invalid_argument("--device " + text + ": no CUDA device is usable here (" +
                                (SEQREC_HAVE_CUDA ? std::string("no device visible to this process")
                                                  : std::string("this seqrec is built against a LibTorch without CUDA")) +
                                "); use --device cpu");
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  if (device.index() >= count)
    throw std::invalid_argument("--device " + text + ": this machine has " + std::to_string(count) +
                                " CUDA device(s), numbered from 0");
}

void use_device(const at::Device& device) {
#if SEQREC_HAVE_CUDA
  if (device.is_cuda()) c10::cuda::set_device(device.index());
#endif
  (void)device;
}

namespace {
at::Generator cuda_generator(const at::Device& device) { return at::globalContext().defaultGenerator(device); }
}  // namespace

void seed_device_generator(const at::Device& device, uint64_t seed) {
  if (!device.is_cuda()) return;
  auto gen = cuda_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
}

at::Tensor device_generator_state(const at::Device& device) {
  if (!device.is_cuda()) return {};
  auto gen = cuda_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_device_generator_state(const at::Device& device, const at::Tensor& state) {
  if (!device.is_cuda()) return;
  auto gen = cuda_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

double device_peak_mib(const at::Device& device) {
#if SEQREC_HAVE_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<double>(stats.allocated_bytes[0].peak) / (1 << 20);  // [0]: all pools
  }
#endif
  (void)device;
  return 0;
}

void reset_device_peak(const at::Device& device) {
#if SEQREC_HAVE_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
  (void)device;
}

std::string describe_machine(const at::Device& device) {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown");
  std::string cpu = "unknown";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      cpu = line.substr(line.find(':') + 1);
      cpu.erase(0, cpu.find_first_not_of(" \t"));
      break;
    }
  std::string out = std::string("host ") + host + ", CPU " + cpu + " (" +
                    std::to_string(std::thread::hardware_concurrency()) + " logical cores)";
#if SEQREC_HAVE_CUDA
  if (device.is_cuda()) {
    cudaDeviceProp prop;
    const int index = device.has_index() ? device.index() : static_cast<int>(c10::cuda::current_device());
    if (cudaGetDeviceProperties(&prop, index) == cudaSuccess) {
      char gib[32];
      std::snprintf(gib, sizeof gib, "%.1f", static_cast<double>(prop.totalGlobalMem) / (1ull << 30));
      out += ", GPU " + std::string(prop.name) + " (" + gib + " GiB)";
    }
  }
#endif
  (void)device;
  return out;
}

}  // namespace seqrec::train
