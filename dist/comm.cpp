#include "dist/comm.h"

#include <torch/torch.h>

#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "seqrec_config.h"

namespace seqrec::dist {

#if SEQREC_HAVE_MPI
std::unique_ptr<Comm> make_mpi_comm();  // comm_mpi.cpp
#endif

namespace {

class LocalComm : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  void all_reduce(at::Tensor& t, ReduceOp) override {
    TORCH_CHECK(t.is_contiguous(), "all_reduce needs a contiguous tensor");
  }
  void broadcast(at::Tensor& t, int root) override {
    TORCH_CHECK(root == 0, "broadcast root ", root, " out of range for 1 rank");
  }
  at::Tensor all_gather(const at::Tensor& t) override { return t.unsqueeze(0).clone(); }
  at::Tensor all_to_all(const at::Tensor& send, const std::vector<int64_t>& send_counts,
                        std::vector<int64_t>* recv_counts) override {
    // The same checks as under MPI, so code that passes single-process tests does not first
    // fail (or block) when run under mpirun.
    check_all_to_all_args(send, send_counts);
    if (recv_counts) *recv_counts = send_counts;
    return send.clone();  // a copy, as under MPI: the caller may overwrite `send` afterwards
  }
  void barrier() override {}
  std::unique_ptr<Comm> split(int color, int key) override {
    if (color < 0) throw std::invalid_argument("split: color must be >= 0, got " + std::to_string(color));
    return make_local_comm();
  }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

bool env_says_multiprocess() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"}) {
    if (const char* s = std::getenv(v))
      if (std::atoi(s) > 1) return true;
  }
  return false;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

std::vector<std::string> Comm::all_gather_string(const std::string& s) {
  auto len = torch::tensor({static_cast<int64_t>(s.size())}, torch::kInt64);
  auto lens = all_gather(len).view({-1});
  const int64_t max_len = lens.max().item<int64_t>();
  auto buf = torch::zeros({std::max<int64_t>(max_len, 1)}, torch::kUInt8);
  std::memcpy(buf.data_ptr<uint8_t>(), s.data(), s.size());
  auto all = all_gather(buf);
  std::vector<std::string> out;
  for (int r = 0; r < size(); ++r)
    out.emplace_back(reinterpret_cast<const char*>(all[r].data_ptr<uint8_t>()), lens[r].item<int64_t>());
  return out;
}

std::string Comm::broadcast_string(const std::string& s, int root) {
  auto len = torch::tensor({static_cast<int64_t>(s.size())}, torch::kInt64);
  broadcast(len, root);
  auto buf = torch::zeros({std::max<int64_t>(len.item<int64_t>(), 1)}, torch::kUInt8);
  if (rank() == root) std::memcpy(buf.data_ptr<uint8_t>(), s.data(), s.size());
  broadcast(buf, root);
  return std::string(reinterpret_cast<const char*>(buf.data_ptr<uint8_t>()), len.item<int64_t>());
}

void Comm::check_all_to_all_args(const at::Tensor& send, const std::vector<int64_t>& send_counts) const {
  auto fail = [](const std::string& what) { throw std::invalid_argument("all_to_all: " + what); };
  if (!send.defined()) fail("send is an undefined tensor");
  if (send.dim() == 0) fail("send is a 0-dim tensor; rows are split along dim 0, so it needs at least one dimension");
  if (!send.is_contiguous()) fail("send must be contiguous (rows are sent as byte ranges)");
  switch (send.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kInt: case at::kLong: case at::kByte:
    case at::kBool: case at::kBFloat16: case at::kHalf:
      break;
    default:
      fail(std::string("unsupported dtype ") + c10::toString(send.scalar_type()) +
           " (float32, float64, int32, int64, uint8, bool, bfloat16, float16)");
  }
  if (send_counts.size() != static_cast<size_t>(size()))
    fail("send_counts has " + std::to_string(send_counts.size()) + " entries but there are " +
         std::to_string(size()) + " ranks");
  const int64_t rows = send.size(0);
  for (size_t r = 0; r < send_counts.size(); ++r)
    if (send_counts[r] < 0)
      fail("send_counts[" + std::to_string(r) + "] = " + std::to_string(send_counts[r]) + " is negative");
  int64_t sum = 0;
  for (auto c : send_counts) {
    // Compared before adding so that huge counts cannot overflow the running sum.
    if (c > rows - sum) {
      sum = -1;
      break;
    }
    sum += c;
  }
  if (sum != rows) {
    std::string list;
    for (auto c : send_counts) list += (list.empty() ? "" : ",") + std::to_string(c);
    fail("send_counts [" + list + "] do not sum to the " + std::to_string(rows) + " rows of send");
  }
}

std::unique_ptr<Comm> make_local_comm() { return std::make_unique<LocalComm>(); }

std::unique_ptr<Comm> make_comm(const std::string& backend) {
  if (backend == "local") return make_local_comm();
  if (backend != "auto" && backend != "mpi")
    throw std::invalid_argument("unknown communication backend '" + backend + "' (auto, local, mpi)");
#if SEQREC_HAVE_MPI
  if (backend == "mpi" || env_says_multiprocess()) return make_mpi_comm();
  return make_local_comm();
#else
  if (backend == "mpi") throw std::invalid_argument("seqrec was built without MPI: --comm mpi is unavailable");
  if (env_says_multiprocess())
    throw std::runtime_error(
        "started by a multi-process launcher but seqrec was built without MPI: every process would train alone");
  return make_local_comm();
#endif
}

void check_same_config(Comm& comm, const std::string& config_text) {
  if (comm.size() == 1) return;
  auto h = torch::tensor({static_cast<int64_t>(fnv1a(config_text))}, torch::kInt64);
  auto all = comm.all_gather(h).view({-1});
  int differing = -1;
  for (int r = 1; r < comm.size() && differing < 0; ++r)
    if (all[r].item<int64_t>() != all[0].item<int64_t>()) differing = r;
  if (differing < 0) return;
  // Every rank takes this branch (they all saw the same hashes), so the gather below is
  // collective and every rank throws: none is left waiting.
  auto texts = comm.all_gather_string(config_text);
  auto a = lines_of(texts[0]), b = lines_of(texts[differing]);
  std::string detail;
  for (size_t i = 0; i < std::max(a.size(), b.size()) && detail.empty(); ++i) {
    const std::string x = i < a.size() ? a[i] : "(none)", y = i < b.size() ? b[i] : "(none)";
    if (x != y) detail = "'" + x + "' on rank 0 vs '" + y + "' on rank " + std::to_string(differing);
  }
  throw std::runtime_error("rank " + std::to_string(differing) +
                           " runs a different configuration from rank 0: " + detail);
}

}  // namespace seqrec::dist
