#include "train/checkpoint.h"

#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <stdexcept>

#include "dist/comm.h"
#include "io/log.h"
#include "io/remove_tree.h"

namespace seqrec::train {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'S', 'Q', 'R', 'C', 'K', 'P', 'T', '\0'};

// Stable on-disk dtype codes (never reuse a number).
struct DtypeCode {
  uint8_t code;
  at::ScalarType type;
};
constexpr DtypeCode kDtypes[] = {{1, at::kFloat},  {2, at::kDouble}, {3, at::kLong}, {4, at::kInt},
                                 {5, at::kByte},   {6, at::kBool},   {7, at::kHalf}, {8, at::kBFloat16},
                                 {9, at::kChar},   {10, at::kShort}};

uint8_t code_of(at::ScalarType t) {
  for (auto& d : kDtypes)
    if (d.type == t) return d.code;
  throw std::invalid_argument(std::string("checkpoint: unsupported dtype ") + c10::toString(t));
}

class Writer {
 public:
  void u8(uint8_t v) { bytes(&v, 1); }
  void u32(uint32_t v) { bytes(&v, 4); }
  void u64(uint64_t v) { bytes(&v, 8); }
  void str(const std::string& s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
  void bytes(const void* p, size_t n) { buf_.append(static_cast<const char*>(p), n); }
  const std::string& data() const { return buf_; }

 private:
  std::string buf_;
};

class Reader {
 public:
  Reader(const std::string& data, const std::string& path) : d_(data), path_(path) {}
  void need(size_t n) const {
    if (pos_ + n > d_.size())
      throw std::runtime_error(path_ + ": truncated checkpoint file (needs " + std::to_string(pos_ + n) +
                               " bytes, has " + std::to_string(d_.size()) + ")");
  }
  uint8_t u8() { return pod<uint8_t>(); }
  uint32_t u32() { return pod<uint32_t>(); }
  uint64_t u64() { return pod<uint64_t>(); }
  std::string str() {
    const uint64_t n = u64();
    need(n);
    std::string s = d_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  const char* take(size_t n) {
    need(n);
    const char* p = d_.data() + pos_;
    pos_ += n;
    return p;
  }
  size_t remaining() const { return d_.size() - pos_; }

 private:
  template <typename T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, d_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  const std::string& d_;
  const std::string& path_;
  size_t pos_ = 0;
};

uint32_t crc_of(const char* p, size_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    c = crc32(c, reinterpret_cast<const Bytef*>(p), chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open checkpoint file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open for fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw std::runtime_error(path + ": fsync failed: " + std::strerror(errno));
}

// Writes and fsyncs a whole file.
void write_durable(const std::string& path, const std::string& data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error(path + ": cannot create: " + std::strerror(errno));
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string err = std::strerror(errno);
      ::close(fd);
      throw std::runtime_error(path + ": write failed: " + err);
    }
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) throw std::runtime_error(path + ": fsync/close failed");
}

std::string step_name(int64_t step) {
  std::ostringstream s;
  s << "step-" << std::setw(12) << std::setfill('0') << step;
  return s.str();
}

std::string rank_file(int rank) {
  std::ostringstream s;
  s << "rank-" << std::setw(5) << std::setfill('0') << rank << ".bin";
  return s.str();
}

struct ManifestEntry {
  std::string name;
  uint64_t size = 0;
  uint32_t crc = 0;
};

struct Manifest {
  int version = 0;
  int world_size = 1;
  int64_t step = 0;
  std::vector<ManifestEntry> files;
};

Manifest read_manifest(const std::string& dir) {
  const std::string path = dir + "/MANIFEST";
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": missing (not a complete checkpoint)");
  Manifest m;
  std::string key;
  while (in >> key) {
    if (key == "version") in >> m.version;
    else if (key == "world_size") in >> m.world_size;
    else if (key == "step") in >> m.step;
    else if (key == "file") {
      ManifestEntry e;
      in >> e.name >> e.size >> std::hex >> e.crc >> std::dec;
      m.files.push_back(e);
    } else {
      throw std::runtime_error(path + ": unexpected entry '" + key + "'");
    }
    if (!in) throw std::runtime_error(path + ": malformed");
  }
  if (m.version != kCheckpointVersion)
    throw std::runtime_error(path + ": checkpoint version " + std::to_string(m.version) + ", this build reads " +
                             std::to_string(kCheckpointVersion));
  return m;
}

// Cheap first check when picking the newest checkpoint: marker and manifest present, sizes match.
bool looks_complete(const fs::path& dir) {
  try {
    if (!fs::exists(dir / "COMPLETE")) return false;
    auto m = read_manifest(dir.string());
    for (auto& f : m.files)
      if (!fs::exists(dir / f.name) || fs::file_size(dir / f.name) != f.size) return false;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

int64_t step_of(const fs::path& dir) {
  const std::string n = dir.filename().string();
  if (n.rfind("step-", 0) != 0) return -1;
  try {
    return std::stoll(n.substr(5));
  } catch (...) {
    return -1;
  }
}

}  // namespace

const at::Tensor& TensorBundle::tensor(const std::string& name) const {
  for (auto& [n, t] : tensors)
    if (n == name) return t;
  throw std::runtime_error("checkpoint has no tensor '" + name + "'");
}

bool TensorBundle::has_tensor(const std::string& name) const {
  for (auto& [n, t] : tensors)
    if (n == name) return true;
  return false;
}

const std::string& TensorBundle::value(const std::string& key) const {
  auto it = meta.find(key);
  if (it == meta.end()) throw std::runtime_error("checkpoint has no metadata key '" + key + "'");
  return it->second;
}

void write_bundle_file(const std::string& path, const TensorBundle& bundle) {
  Writer w;
  w.bytes(kMagic, sizeof kMagic);
  w.u32(kCheckpointVersion);
  w.u32(static_cast<uint32_t>(bundle.meta.size()));
  for (auto& [k, v] : bundle.meta) {
    w.str(k);
    w.str(v);
  }
  w.u32(static_cast<uint32_t>(bundle.tensors.size()));
  for (auto& [name, t0] : bundle.tensors) {
    auto t = t0.detach().to(torch::kCPU).contiguous();
    w.str(name);
    w.u8(code_of(t.scalar_type()));
    w.u32(static_cast<uint32_t>(t.dim()));
    for (auto s : t.sizes()) w.u64(static_cast<uint64_t>(s));
    const uint64_t nbytes = t.numel() * t.element_size();
    w.u64(nbytes);
    if (nbytes) w.bytes(t.data_ptr(), nbytes);
  }
  w.u32(crc_of(w.data().data(), w.data().size()));
  write_durable(path, w.data());
}

TensorBundle read_bundle_file(const std::string& path) {
  const std::string data = read_file(path);
  if (data.size() < sizeof kMagic + 8) throw std::runtime_error(path + ": truncated checkpoint file");
  if (std::memcmp(data.data(), kMagic, sizeof kMagic) != 0)
    throw std::runtime_error(path + ": not a seqrec checkpoint file (bad magic)");
  uint32_t stored;
  std::memcpy(&stored, data.data() + data.size() - 4, 4);
  if (crc_of(data.data(), data.size() - 4) != stored)
    throw std::runtime_error(path + ": checksum mismatch (corrupt or truncated checkpoint file)");
  const std::string body = data.substr(0, data.size() - 4);
  Reader r(body, path);
  r.take(sizeof kMagic);
  const uint32_t version = r.u32();
  if (version != kCheckpointVersion)
    throw std::runtime_error(path + ": checkpoint format version " + std::to_string(version) +
                             ", this build reads " + std::to_string(kCheckpointVersion));
  TensorBundle b;
  const uint32_t n_meta = r.u32();
  for (uint32_t i = 0; i < n_meta; ++i) {
    std::string k = r.str();
    b.meta[k] = r.str();
  }
  const uint32_t n_tensors = r.u32();
  for (uint32_t i = 0; i < n_tensors; ++i) {
    std::string name = r.str();
    const uint8_t code = r.u8();
    at::ScalarType type = at::kFloat;
    bool known = false;
    for (auto& d : kDtypes)
      if (d.code == code) {
        type = d.type;
        known = true;
      }
    if (!known) throw std::runtime_error(path + ": tensor '" + name + "' has unknown dtype code " + std::to_string(code));
    const uint32_t ndim = r.u32();
    if (ndim > 16) throw std::runtime_error(path + ": tensor '" + name + "' has " + std::to_string(ndim) + " dimensions");
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    for (uint32_t d = 0; d < ndim; ++d) {
      const uint64_t s = r.u64();
      if (s > body.size() * 8 + 1) throw std::runtime_error(path + ": tensor '" + name + "' has an absurd size");
      shape.push_back(static_cast<int64_t>(s));
      numel *= s;
    }
    const uint64_t nbytes = r.u64();
    auto t = torch::empty(shape, torch::TensorOptions().dtype(type));
    if (nbytes != numel * t.element_size())
      throw std::runtime_error(path + ": tensor '" + name + "' byte count does not match its shape");
    if (nbytes) std::memcpy(t.data_ptr(), r.take(nbytes), nbytes);
    b.tensors.emplace_back(std::move(name), std::move(t));
  }
  if (r.remaining() != 0) throw std::runtime_error(path + ": trailing bytes after the last tensor");
  return b;
}

void verify_checkpoint(const std::string& dir) {
  if (!fs::exists(fs::path(dir) / "COMPLETE"))
    throw std::runtime_error(dir + ": no COMPLETE marker (an interrupted or partial checkpoint)");
  auto m = read_manifest(dir);
  for (auto& f : m.files) {
    const std::string path = dir + "/" + f.name;
    if (!fs::exists(path)) throw std::runtime_error(path + ": listed in MANIFEST but missing");
    const std::string data = read_file(path);
    if (data.size() != f.size)
      throw std::runtime_error(path + ": size " + std::to_string(data.size()) + " differs from MANIFEST's " +
                               std::to_string(f.size) + " (truncated)");
    if (crc_of(data.data(), data.size()) != f.crc)
      throw std::runtime_error(path + ": checksum differs from MANIFEST (corrupt)");
  }
}

CheckpointManager::CheckpointManager(CheckpointOptions options, dist::Comm& comm)
    : options_(std::move(options)), comm_(comm) {
  if (options_.keep_last < 1) throw std::invalid_argument("keep_last must be >= 1");
}

std::string CheckpointManager::save(int64_t step, const TensorBundle& shared, const TensorBundle& per_rank) {
  const fs::path root(options_.dir);
  const fs::path tmp = root / (".tmp-" + step_name(step));
  const fs::path final_dir = root / step_name(step);
  const int rank = comm_.rank(), world = comm_.size();
  // Errors on one rank must not leave the others in a barrier: each phase reports success
  // through an all-reduce, and every rank throws together.
  auto agree = [&](bool ok, const std::string& what) {
    auto flag = torch::tensor({ok ? 0 : 1}, torch::kInt32);
    comm_.all_reduce(flag);
    if (flag.item<int>() != 0) throw std::runtime_error("checkpoint " + final_dir.string() + ": " + what);
  };
  std::string error;
  if (rank == 0) {
    try {
      fs::create_directories(root);
      io::remove_tree(tmp.string());
      fs::create_directories(tmp);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree(error.empty(), error.empty() ? "rank 0 could not create the temporary directory" : error);
  try {
    if (rank == 0) write_bundle_file((tmp / "shared.bin").string(), shared);
    write_bundle_file((tmp / rank_file(rank)).string(), per_rank);
  } catch (const std::exception& e) {
    error = e.what();
    LOG(ERROR) << "rank " << rank << ": " << error;
  }
  agree(error.empty(), "a rank failed to write its file" + (error.empty() ? std::string() : ": " + error));
  if (rank == 0) {
    try {
      std::ostringstream m;
      m << "version " << kCheckpointVersion << "\nworld_size " << world << "\nstep " << step << "\n";
      std::vector<std::string> names{"shared.bin"};
      for (int r = 0; r < world; ++r) names.push_back(rank_file(r));
      for (auto& n : names) {
        const std::string data = read_file((tmp / n).string());
        m << "file " << n << " " << data.size() << " " << std::hex << crc_of(data.data(), data.size()) << std::dec
          << "\n";
      }
      write_durable((tmp / "MANIFEST").string(), m.str());
      fsync_path(tmp.string(), true);
      // A directory of the same name is a leftover (or an older save of this step): move it
      // aside, move the new one in, then delete the old.
      fs::path old;
      if (fs::exists(final_dir)) {
        old = root / (".old-" + step_name(step));
        io::remove_tree(old.string());
        fs::rename(final_dir, old);
      }
      fs::rename(tmp, final_dir);
      write_durable((final_dir / "COMPLETE").string(), std::to_string(step) + "\n");
      fsync_path(final_dir.string(), true);
      fsync_path(root.string(), true);
      if (!old.empty()) io::remove_tree(old.string());
      // Prune: keep the newest keep_last complete checkpoints; remove stale temporaries.
      std::vector<fs::path> complete;
      for (auto& e : fs::directory_iterator(root)) {
        const std::string n = e.path().filename().string();
        if (n.rfind(".tmp-", 0) == 0 || n.rfind(".old-", 0) == 0) {
          io::remove_tree(e.path().string());
        } else if (step_of(e.path()) >= 0 && fs::exists(e.path() / "COMPLETE")) {
          complete.push_back(e.path());
        }
      }
      std::sort(complete.begin(), complete.end(), [](auto& a, auto& b) { return step_of(a) > step_of(b); });
      for (size_t i = options_.keep_last; i < complete.size(); ++i) io::remove_tree(complete[i].string());
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree(error.empty(), error.empty() ? "rank 0 failed to commit it" : error);
  return final_dir.string();
}

std::optional<std::string> CheckpointManager::latest() const {
  const fs::path root(options_.dir);
  if (!fs::exists(root)) return std::nullopt;
  std::vector<fs::path> dirs;
  for (auto& e : fs::directory_iterator(root))
    if (e.is_directory() && step_of(e.path()) >= 0) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end(), [](auto& a, auto& b) { return step_of(a) > step_of(b); });
  // Newest first; a damaged newest one falls back to the one before (nothing saved is lost
  // to a bad write), with the reason logged.
  for (auto& d : dirs) {
    if (!looks_complete(d)) {
      LOG(WARNING) << "skipping incomplete checkpoint " << d.string();
      continue;
    }
    try {
      verify_checkpoint(d.string());
      return d.string();
    } catch (const std::exception& e) {
      LOG(WARNING) << "skipping damaged checkpoint: " << e.what();
    }
  }
  return std::nullopt;
}

CheckpointManager::Loaded CheckpointManager::load(const std::string& dir) const {
  verify_checkpoint(dir);
  const Manifest m = read_manifest(dir);
  Loaded out;
  out.saved_world_size = m.world_size;
  out.shared = read_bundle_file(dir + "/shared.bin");
  if (m.world_size == comm_.size()) out.per_rank = read_bundle_file(dir + "/" + rank_file(comm_.rank()));
  return out;
}

}  // namespace seqrec::train
