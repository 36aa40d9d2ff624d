// The MPI backend (Open MPI; any MPI-3 library). MPI moves host memory: a tensor on another
// device (a GPU) is staged through a host copy, which is what lets several GPU processes train
// data-parallel over MPI (slower than NCCL, which moves device memory itself, but on any MPI).
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

void require_contiguous(const at::Tensor& t, const char* what) {
  if (!t.is_contiguous()) throw std::invalid_argument(std::string(what) + ": tensor must be contiguous");
}

// An in-place collective on a tensor off the host (a GPU's): run on a host copy, then copied
// back; false (nothing done) for a CPU tensor. The first copy waits for the device's queued work
// on the tensor, and the result lands before any later work on it.
template <typename F>
bool staged_in_place(at::Tensor& t, F&& collective) {
  if (t.device().is_cpu()) return false;
  auto host = t.to(at::kCPU);
  collective(host);
  t.copy_(host);
  return true;
}

// Counts above INT_MAX are sent in chunks (MPI counts are int).
template <typename F>
void chunked(int64_t numel, size_t elem, F&& fn) {
  const int64_t chunk = INT_MAX / 2;
  for (int64_t off = 0; off < numel; off += chunk) fn(off * elem, static_cast<int>(std::min(chunk, numel - off)));
}

// Identifies a trailing shape in the all_to_all count exchange: ranks must agree on it, and
// one int64 per destination is cheaper than exchanging the shape itself.
int64_t shape_fingerprint(c10::IntArrayRef sizes) {
  uint64_t h = 1469598103934665603ull ^ sizes.size();
  for (int64_t s : sizes) h = (h ^ static_cast<uint64_t>(s)) * 1099511628211ull;
  return static_cast<int64_t>(h);
}

std::string shape_string(c10::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? "," : "") + std::to_string(sizes[i]);
  return out + "]";
}

// Frees a derived datatype however the collective using it ends (MPI_CHECK throws).
struct TypeGuard {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  ~TypeGuard() {
    if (t != MPI_DATATYPE_NULL) MPI_Type_free(&t);
  }
};

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
    attach();
  }
  // A sub-communicator (from split()); MPI stays initialised by the world's Comm.
  explicit MpiComm(MPI_Comm sub) : comm_(sub) { attach(); }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_WORLD && !finalized) MPI_Comm_free(&comm_);
    if (owns_init_ && !finalized) MPI_Finalize();
  }
  std::unique_ptr<Comm> split(int color, int key) override {
    if (color < 0) throw std::invalid_argument("split: color must be >= 0, got " + std::to_string(color));
    MPI_Comm sub;
    MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
    return std::unique_ptr<Comm>(new MpiComm(sub));
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    require_contiguous(t, "all_reduce");
    if (staged_in_place(t, [&](at::Tensor& host) { all_reduce(host, op); })) return;
    auto* base = static_cast<char*>(t.data_ptr());
    chunked(t.numel(), t.element_size(), [&](size_t byte_off, int count) {
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, base + byte_off, count, mpi_type(t), mpi_op(op), comm_));
    });
  }
  void broadcast(at::Tensor& t, int root) override {
    require_contiguous(t, "broadcast");
    if (root < 0 || root >= size_) throw std::invalid_argument("broadcast root " + std::to_string(root) + " out of range");
    if (staged_in_place(t, [&](at::Tensor& host) { broadcast(host, root); })) return;
    auto* base = static_cast<char*>(t.data_ptr());
    chunked(t.numel(), t.element_size(), [&](size_t byte_off, int count) {
      MPI_CHECK(MPI_Bcast(base + byte_off, count, mpi_type(t), root, comm_));
    });
  }
  at::Tensor all_gather(const at::Tensor& t) override {
    require_contiguous(t, "all_gather");
    if (!t.device().is_cpu()) return all_gather(t.to(at::kCPU)).to(t.device());
    std::vector<int64_t> shape{size_};
    for (auto s : t.sizes()) shape.push_back(s);
    auto out = torch::empty(shape, t.options());
    if (t.numel() * size_ > INT_MAX) throw std::invalid_argument("all_gather: tensor too large");
    MPI_CHECK(MPI_Allgather(t.data_ptr(), static_cast<int>(t.numel()), mpi_type(t), out.data_ptr(),
                            static_cast<int>(t.numel()), mpi_type(t), comm_));
    return out;
  }
  at::Tensor all_to_all(const at::Tensor& send, const std::vector<int64_t>& send_counts,
                        std::vector<int64_t>* recv_counts) override {
    // Argument errors throw here, before this rank takes part in any communication.
    check_all_to_all_args(send, send_counts);
    require_contiguous(send, "all_to_all");
    if (!send.device().is_cpu()) return all_to_all(send.to(at::kCPU), send_counts, recv_counts).to(send.device());
    const auto trailing = send.sizes().slice(1);
    const int64_t row_bytes = c10::multiply_integers(trailing) * static_cast<int64_t>(send.element_size());

    // One exchange carries, besides the count for each destination, what every rank must agree
    // on (dtype, row size, trailing shape) and its total rows, so that each rank sees every
    // other rank's values: a disagreement or an oversized call is then found by every rank
    // and they all throw together instead of some entering MPI_Alltoallv and blocking there.
    enum { kCount, kDtype, kRowBytes, kShape, kSendRows, kFields };
    const int64_t shape_fp = shape_fingerprint(trailing);
    std::vector<int64_t> mine(static_cast<size_t>(kFields) * size_), theirs(mine.size());
    for (int r = 0; r < size_; ++r) {
      int64_t* f = &mine[static_cast<size_t>(r) * kFields];
      f[kCount] = send_counts[r];
      f[kDtype] = static_cast<int64_t>(send.scalar_type());
      f[kRowBytes] = row_bytes;
      f[kShape] = shape_fp;
      f[kSendRows] = send.size(0);
    }
    MPI_CHECK(MPI_Alltoall(mine.data(), kFields, MPI_INT64_T, theirs.data(), kFields, MPI_INT64_T, comm_));
    auto field = [&](int r, int k) { return theirs[static_cast<size_t>(r) * kFields + k]; };

    std::vector<int64_t> counts(size_);
    int64_t recv_rows = 0, all_rows = 0, max_send_rows = 0;
    int max_sender = 0;
    for (int r = 0; r < size_; ++r) {
      if (field(r, kDtype) != mine[kDtype] || field(r, kRowBytes) != row_bytes || field(r, kShape) != shape_fp) {
        const auto other = static_cast<at::ScalarType>(field(r, kDtype));
        throw std::invalid_argument(
            "all_to_all: ranks disagree on the rows they exchange: rank " + std::to_string(r) + " sends " +
            c10::toString(other) + " rows of " + std::to_string(field(r, kRowBytes)) + " bytes" +
            (field(r, kShape) != shape_fp && field(r, kDtype) == mine[kDtype] ? " of another trailing shape" : "") +
            ", rank " + std::to_string(rank_) + " (this one) " + c10::toString(send.scalar_type()) +
            " rows of shape " + shape_string(trailing) + " (" + std::to_string(row_bytes) + " bytes)");
      }
      counts[r] = field(r, kCount);
      recv_rows += counts[r];
      all_rows += field(r, kSendRows);
      if (field(r, kSendRows) > max_send_rows) max_send_rows = field(r, kSendRows), max_sender = r;
    }
    std::vector<int64_t> out_shape{recv_rows};
    out_shape.insert(out_shape.end(), trailing.begin(), trailing.end());
    if (row_bytes == 0) {
      // Rows of no bytes (a zero-size trailing dimension): nothing to move, and no MPI limit
      // applies. Every rank has the same row size (checked above), so all return here.
      if (recv_counts) *recv_counts = std::move(counts);
      return torch::empty(out_shape, send.options());
    }

    // MPI_Alltoallv counts and displacements are int. Counting in rows (the datatype below)
    // rather than bytes keeps realistic calls far from INT_MAX; beyond it the caller must
    // split the call. A rank's send offsets are below its row count, its receive offsets below
    // its received rows: every rank checks every sender from the exchange, and the receive
    // totals, which only their receiver knows, are compared collectively when the rows of all
    // ranks together could exceed INT_MAX (never in practice, so normally no extra round).
    if (max_send_rows > INT_MAX)
      throw std::invalid_argument("all_to_all: rank " + std::to_string(max_sender) + " sends " +
                                  std::to_string(max_send_rows) + " rows, over the MPI count limit of " +
                                  std::to_string(INT_MAX) + " rows per rank and call; split the call");
    if (row_bytes > INT_MAX)
      throw std::invalid_argument("all_to_all: one row is " + std::to_string(row_bytes) +
                                  " bytes, over the MPI limit of " + std::to_string(INT_MAX) + " bytes for a row");
    if (all_rows > INT_MAX) {
      int64_t max_recv_rows = recv_rows;
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &max_recv_rows, 1, MPI_INT64_T, MPI_MAX, comm_));
      if (max_recv_rows > INT_MAX)
        throw std::invalid_argument("all_to_all: a rank would receive " + std::to_string(max_recv_rows) +
                                    " rows (this rank " + std::to_string(recv_rows) +
                                    "), over the MPI count limit of " + std::to_string(INT_MAX) +
                                    " rows per rank and call; split the call");
    }

    auto out = torch::empty(out_shape, send.options());
    std::vector<int> scounts(size_), sdispls(size_), rcounts(size_), rdispls(size_);
    for (int r = 0, soff = 0, roff = 0; r < size_; ++r) {
      scounts[r] = static_cast<int>(send_counts[r]);
      rcounts[r] = static_cast<int>(counts[r]);
      sdispls[r] = soff;
      rdispls[r] = roff;
      soff += scounts[r];
      roff += rcounts[r];
    }
    // One row as the unit: a contiguous run of its bytes (the dtype does not matter to a copy,
    // which is what makes bool and the 16-bit floats work without MPI types of their own).
    TypeGuard row;
    MPI_CHECK(MPI_Type_contiguous(static_cast<int>(row_bytes), MPI_BYTE, &row.t));
    MPI_CHECK(MPI_Type_commit(&row.t));
    MPI_CHECK(MPI_Alltoallv(send.data_ptr(), scounts.data(), sdispls.data(), row.t, out.data_ptr(), rcounts.data(),
                            rdispls.data(), row.t, comm_));
    if (recv_counts) *recv_counts = std::move(counts);
    return out;
  }
  void barrier() override { MPI_CHECK(MPI_Barrier(comm_)); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  // Errors come back as codes (MPI_CHECK); rank, size and the node-local share of comm_.
  void attach() {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    MPI_Comm local;
    MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
    MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
    MPI_CHECK(MPI_Comm_size(local, &local_size_));
    MPI_Comm_free(&local);
  }

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool owns_init_ = false;
  MPI_Comm comm_ = MPI_COMM_WORLD;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm() { return std::make_unique<MpiComm>(); }

}  // namespace seqrec::dist
