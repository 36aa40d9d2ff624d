#include "train/run_lock.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

namespace seqrec::train {

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

std::string RunDirLock::acquire(const std::string& dir) {
  const std::string path = dir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) return "cannot open " + path + ": " + std::strerror(errno);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
    ::close(fd_);
    fd_ = -1;
    // A filesystem without locks (some network mounts) runs unguarded rather than not at all.
    if (err == ENOLCK || err == EOPNOTSUPP) return {};
    if (err != EWOULDBLOCK) return "cannot lock " + path + ": " + std::strerror(err);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    return "run directory " + dir + " is in use by another seqrec train" +
           (holder.empty() ? std::string() : " (pid " + holder + ")") +
           ": wait for it to end (a stopped run writes its last checkpoint first), or use another --out";
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
    return "cannot write " + path + ": " + std::strerror(errno);
  return {};
}

RunLockHolder run_lock_holder(const std::string& dir) {
  RunLockHolder h;
  struct stat st {};
  if (::stat((dir + "/.lock").c_str(), &st) != 0) return h;
  std::ifstream locks("/proc/locks");
  if (!locks) return h;
  // Each line: "N: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE START END" (major and minor in hex;
  // a lock others wait for is listed again after "->", which the match on FLOCK skips).
  const unsigned maj = major(st.st_dev), min = minor(st.st_dev);
  h.state = RunLockHolder::State::kFree;
  for (std::string line; std::getline(locks, line);) {
    std::istringstream in(line);
    std::string slot, kind, mode, access, where;
    int64_t pid = -1;
    if (!(in >> slot >> kind >> mode >> access >> pid >> where) || kind != "FLOCK") continue;
    unsigned lmaj = 0, lmin = 0;
    unsigned long long inode = 0;
    if (std::sscanf(where.c_str(), "%x:%x:%llu", &lmaj, &lmin, &inode) != 3) continue;
    if (inode == static_cast<unsigned long long>(st.st_ino) && lmaj == maj && lmin == min) {
      h.state = RunLockHolder::State::kHeld;
      h.pid = pid;
      return h;
    }
  }
  return h;
}

}  // namespace seqrec::train
