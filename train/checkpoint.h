#pragma once
// Versioned, atomic checkpoints (DESIGN.md "Checkpoint", STYLE.md #10).
//
// Layout:  <dir>/step-000000001234/
//            shared.bin          tensors + key/value metadata written by rank 0
//            rank-00000.bin ...  per-rank tensors (RNG states, ...) written by each rank
//            MANIFEST            one line per file: name size crc32c(hex)
//            COMPLETE            marker, written last
// A checkpoint is written to <dir>/.tmp-step-.../ and renamed into place only after every
// file is written and fsync'ed; the marker is written after the rename. A directory without
// the marker, or whose files fail the manifest, is never loaded.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace seqrec::dist {
class Comm;
}

namespace seqrec::train {

inline constexpr int kCheckpointVersion = 1;

// A named bag of tensors and string metadata; the unit written to one file.
struct TensorBundle {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::map<std::string, std::string> meta;

  const at::Tensor& tensor(const std::string& name) const;  // throws naming the key
  const std::string& value(const std::string& key) const;   // throws naming the key
  bool has_tensor(const std::string& name) const;
};

// Single-file format (little endian): magic "SQRCKPT\0", u32 version, u32 n_meta,
// {str key, str value}*, u32 n_tensors, {str name, u8 dtype, u32 ndim, i64 dims[ndim],
// u64 nbytes, bytes}*, u32 crc32 of everything before it. Throws std::runtime_error naming
// the file on truncation, a bad magic/version or a checksum mismatch.
void write_bundle_file(const std::string& path, const TensorBundle& bundle);
TensorBundle read_bundle_file(const std::string& path);

struct CheckpointOptions {
  std::string dir;      // <run>/checkpoints
  int keep_last = 3;    // older complete checkpoints are removed after a successful save
};

class CheckpointManager {
 public:
  CheckpointManager(CheckpointOptions options, dist::Comm& comm);

  // Collective: rank 0 writes `shared`, every rank writes `per_rank`. Returns the final
  // directory. On any failure nothing is renamed into place and earlier checkpoints stay.
  std::string save(int64_t step, const TensorBundle& shared, const TensorBundle& per_rank);

  // Newest complete checkpoint in dir (marker present, every file matching MANIFEST's size
  // and checksum), if any; damaged or incomplete ones are skipped with a warning.
  std::optional<std::string> latest() const;

  // Loads a checkpoint directory (verifies the marker and every file against MANIFEST).
  // `per_rank` is this rank's file when the checkpoint was written with the same world
  // size, otherwise empty (the caller re-seeds what lives there).
  struct Loaded {
    TensorBundle shared;
    std::optional<TensorBundle> per_rank;
    int saved_world_size = 1;
  };
  Loaded load(const std::string& checkpoint_dir) const;

 private:
  CheckpointOptions options_;
  dist::Comm& comm_;
};

// Verifies a checkpoint directory (marker + manifest checksums) without loading tensors;
// throws std::runtime_error naming the file that fails.
void verify_checkpoint(const std::string& checkpoint_dir);

}  // namespace seqrec::train
