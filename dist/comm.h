#pragma once
// Collective communication for data- and expert-parallel training. A library never
// creates a Comm from flags: the launcher makes one and passes it down.
#include <ATen/core/Tensor.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace seqrec::dist {

enum class ReduceOp { kSum, kMax, kMin };

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;
  // Rank and process count on this node (threads per rank are set from local_size).
  virtual int local_rank() const { return 0; }
  virtual int local_size() const { return 1; }

  // In place, on contiguous tensors (float32/float64/int32/int64/uint8). The MPI backend moves
  // host memory: a tensor on a GPU is staged through a host copy (and all_gather's and
  // all_to_all's results come back on the input's device).
  virtual void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::kSum) = 0;
  virtual void broadcast(at::Tensor& t, int root) = 0;
  // Returns a tensor of shape [size(), *t.shape] holding every rank's t.
  virtual at::Tensor all_gather(const at::Tensor& t) = 0;
  // Variable-count all-to-all, the dispatch (and, called back with the received counts, the
  // combine) of expert-parallel MoE.
  // Every rank sends rows [offset_r, offset_r + send_counts[r]) of `send` (dim 0, offsets the
  // running sum of send_counts) to rank r, and returns the rows it receives from every rank
  // concatenated in rank order, shape [sum(recv_counts), *send.shape[1:]], same dtype.
  // send_counts has size() entries summing to send.size(0). The counts are exchanged first and
  // written to *recv_counts when it is non-null. Collective: every rank calls it, each with its own counts.
  // `send` is a contiguous tensor of at least one dimension (on a GPU: staged through the host
  // under MPI) of dtype float32, float64, int32, int64, uint8, bool, bfloat16 or float16; every
  // rank passes the same dtype and the same trailing shape. Rows are moved as bytes, so the
  // result is bit-exact.
  // Errors: a bad argument throws std::invalid_argument before this rank communicates, so
  // like the other collectives the caller must validate collectively (if only one rank's
  // arguments are bad the others block in the exchange). Disagreement between ranks (dtype,
  // trailing shape) and transfers beyond MPI's int counts are detected from the exchanged
  // counts and throw std::invalid_argument on every rank.
  virtual at::Tensor all_to_all(const at::Tensor& send, const std::vector<int64_t>& send_counts,
                                std::vector<int64_t>* recv_counts = nullptr) = 0;
  virtual void barrier() = 0;
  // Collective over this communicator: the ranks passing one color (>= 0) form a new
  // communicator, ranked by key (ties by rank here). For expert-parallel groups and the
  // groups of ranks holding replicas of one expert.
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;
  // Ends every process of the job with `code` (no hang when one rank fails).
  [[noreturn]] virtual void abort(int code) = 0;

  // Byte-string helpers built on the tensor collectives.
  std::vector<std::string> all_gather_string(const std::string& s);
  std::string broadcast_string(const std::string& s, int root);

 protected:
  // The argument checks of all_to_all shared by every backend (so a call that fails under
  // MPI fails the same way in a single-process test); throws std::invalid_argument.
  void check_all_to_all_args(const at::Tensor& send, const std::vector<int64_t>& send_counts) const;
};

// The single-process backend (rank 0 of 1): collectives are identities.
std::unique_ptr<Comm> make_local_comm();

// MPI when the process was started by mpirun/srun (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
// SLURM_NTASKS > 1) and seqrec was built with MPI; otherwise the local backend.
// `backend` is "auto", "local" or "mpi" ("mpi" without MPI support is an error).
std::unique_ptr<Comm> make_comm(const std::string& backend = "auto");

// Every rank passes the text of its effective configuration; throws std::runtime_error
// naming the first rank whose configuration hash differs from rank 0's and the first
// differing line.
void check_same_config(Comm& comm, const std::string& config_text);

}  // namespace seqrec::dist
