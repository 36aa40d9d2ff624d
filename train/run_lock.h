#pragma once
// One trainer per run directory: rank 0 of a `seqrec train` holds an exclusive advisory lock
// (flock) on <run>/.lock, with its pid in the file, for as long as the run lives; the kernel
// drops it when the process ends, however it ends. Without it, a resume started while an earlier
// trainer is still writing its stop checkpoint would load one checkpoint while the other process
// writes a newer one. `seqrec info` asks who holds it (without taking it) to tell a run in
// progress from an interrupted one. Nothing here needs Torch.
#include <cstdint>
#include <string>

namespace seqrec::train {

class RunDirLock {
 public:
  RunDirLock() = default;
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  ~RunDirLock();

  // Takes the lock on dir/.lock (creating the file) and writes this process's pid into it.
  // An empty string when the lock is held (or the filesystem has no locks: the run goes
  // unguarded rather than not at all), else why not, naming the holder's pid when it is known.
  std::string acquire(const std::string& dir);

 private:
  int fd_ = -1;
};

// Who holds dir/.lock, read from the kernel's lock table (/proc/locks) without taking the lock,
// so asking never gets in a trainer's way. Only locks taken on this machine are seen.
struct RunLockHolder {
  enum class State { kUnknown, kFree, kHeld } state = State::kUnknown;  // kUnknown: no .lock file, or no /proc/locks
  int64_t pid = -1;                                                     // kHeld: the holder
};
RunLockHolder run_lock_holder(const std::string& dir);

}  // namespace seqrec::train
