#pragma once
// Progress lines on stderr, at most about one per second, only when enabled.
#include <chrono>
#include <cstdint>
#include <string>

namespace seqrec::io {

class Progress {
 public:
  Progress(bool enabled, std::string label);
  // True when enabled and a second has passed since the last line; cheap enough to call
  // every few thousand rows.
  bool due();
  void print(const std::string& message);
  double elapsed_s() const;

  // "1.23 M" style rate, "12 s" style ETA from done/total of any unit (bytes, users).
  static std::string rate(double per_second);
  std::string eta(double done, double total) const;

 private:
  bool enabled_;
  std::string label_;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace seqrec::io
