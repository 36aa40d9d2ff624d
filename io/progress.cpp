#include "io/progress.h"

#include <cstdio>

namespace seqrec::io {

Progress::Progress(bool enabled, std::string label)
    : enabled_(enabled), label_(std::move(label)), start_(std::chrono::steady_clock::now()), last_(start_) {}

bool Progress::due() {
  if (!enabled_) return false;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < std::chrono::seconds(1)) return false;
  last_ = now;
  return true;
}

void Progress::print(const std::string& message) {
  if (!enabled_) return;
  std::fprintf(stderr, "[%s] %s\n", label_.c_str(), message.c_str());
  std::fflush(stderr);
}

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::string Progress::rate(double v) {
  char buf[32];
  if (v >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.2f M", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof(buf), "%.1f k", v / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f ", v);
  return buf;
}

std::string Progress::eta(double done, double total) const {
  if (done <= 0 || total <= done) return "?";
  const double left = elapsed_s() * (total - done) / done;
  char buf[32];
  if (left >= 3600)
    std::snprintf(buf, sizeof(buf), "%.1f h", left / 3600);
  else if (left >= 60)
    std::snprintf(buf, sizeof(buf), "%.1f min", left / 60);
  else
    std::snprintf(buf, sizeof(buf), "%.0f s", left);
  return buf;
}

}  // namespace seqrec::io
