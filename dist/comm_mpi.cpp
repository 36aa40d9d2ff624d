// The MPI backend on CPU tensors (Open MPI; any MPI-3 library).
// Only the C API: keeps the deprecated C++ bindings (and their library) out.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <torch/torch.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "dist/comm.h"

namespace seqrec::dist {
namespace {

std::string host_name() {
  char h[256] = {0};
  gethostname(h, sizeof h - 1);
  return h;
}

// MPI_CHECK: MPI errors are returned (MPI_ERRORS_RETURN), turned into an exception naming
// the call, the place, the host and the rank.
void mpi_fail(int code, const char* expr, const char* file, int line) {
  char msg[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(code, msg, &len);
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  throw std::runtime_error(std::string("MPI error in ") + expr + " at " + file + ":" + std::to_string(line) +
                           " on " + host_name() + " rank " + std::to_string(rank) + ": " + msg);
}
#define MPI_CHECK(expr)                                               \
  do {                                                                \
    const int mpi_check_rc = (expr);                                  \
    if (mpi_check_rc != MPI_SUCCESS) mpi_fail(mpi_check_rc, #expr, __FILE__, __LINE__); \
  } while (0)

MPI_Datatype mpi_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kBool: return MPI_C_BOOL;
    default: throw std::invalid_argument(std::string("MPI backend: unsupported dtype ") + c10::toString(t.scalar_type()));
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_SUM;
}

void require_cpu_contiguous(const at::Tensor& t, const char* what) {
  if (!t.device().is_cpu()) throw std::invalid_argument(std::string(what) + ": the MPI backend needs CPU tensors");
  if (!t.is_contiguous()) throw std::invalid_argument(std::string(what) + ": tensor must be contiguous");
}

// Counts above INT_MAX are sent in chunks (MPI counts are int).
template <typename F>
void chunked(int64_t numel, size_t elem, F&& fn) {
  const int64_t chunk = INT_MAX / 2;
  for (int64_t off = 0; off < numel; off += chunk) fn(off * elem, static_cast<int>(std::min(chunk, numel - off)));
}

class MpiComm : public Comm {
 public:
  MpiComm() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      owns_init_ = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    MPI_Comm local;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
    MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
    MPI_CHECK(MPI_Comm_size(local, &local_size_));
    MPI_Comm_free(&local);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_init_ && !finalized) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    require_cpu_contiguous(t, "all_reduce");
    auto* base = static_cast<char*>(t.data_ptr());
    chunked(t.numel(), t.element_size(), [&](size_t byte_off, int count) {
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, base + byte_off, count, mpi_type(t), mpi_op(op), MPI_COMM_WORLD));
    });
  }
  void broadcast(at::Tensor& t, int root) override {
    require_cpu_contiguous(t, "broadcast");
    if (root < 0 || root >= size_) throw std::invalid_argument("broadcast root " + std::to_string(root) + " out of range");
    auto* base = static_cast<char*>(t.data_ptr());
    chunked(t.numel(), t.element_size(), [&](size_t byte_off, int count) {
      MPI_CHECK(MPI_Bcast(base + byte_off, count, mpi_type(t), root, MPI_COMM_WORLD));
    });
  }
  at::Tensor all_gather(const at::Tensor& t) override {
    require_cpu_contiguous(t, "all_gather");
    std::vector<int64_t> shape{size_};
    for (auto s : t.sizes()) shape.push_back(s);
    auto out = torch::empty(shape, t.options());
    if (t.numel() * size_ > INT_MAX) throw std::invalid_argument("all_gather: tensor too large");
    MPI_CHECK(MPI_Allgather(t.data_ptr(), static_cast<int>(t.numel()), mpi_type(t), out.data_ptr(),
                            static_cast<int>(t.numel()), mpi_type(t), MPI_COMM_WORLD));
    return out;
  }
  void barrier() override { MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool owns_init_ = false;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm() { return std::make_unique<MpiComm>(); }

}  // namespace seqrec::dist
