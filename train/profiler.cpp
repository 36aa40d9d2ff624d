#include "train/profiler.h"

#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <stdexcept>

namespace seqrec::train {
namespace {

namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

std::string row_line(const ProfileRow& r, double wall_us) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "  %10.1f %6.1f%% %10.1f %8lld  %s\n", r.self_us / 1000.0,
                wall_us > 0 ? 100.0 * r.self_us / wall_us : 0.0, r.total_us / 1000.0,
                static_cast<long long>(r.calls), r.name.c_str());
  return buf;
}

}  // namespace

void start_profile() {
  if (impl::profilerEnabled()) throw std::runtime_error("a profiler is already running on this thread");
  prof::enableProfilerLegacy(impl::ProfilerConfig(impl::ProfilerState::CPU));
}

Profile stop_profile() {
  const auto lists = prof::disableProfilerLegacy();
  std::map<std::string, ProfileRow> by_name;
  std::map<std::pair<std::string, std::string>, ProfileRow> by_region;
  struct Open {
    const prof::LegacyEvent* start;
    std::string region;  // the innermost seqrec:: region around this range (itself if it is one)
    double children_us;
  };
  for (const auto& events : lists) {
    // Each thread's ranges nest: a pop closes the latest open push.
    std::vector<Open> open;
    for (const auto& e : events) {
      if (e.kind() == prof::EventKind::PushRange) {
        const std::string name = e.name();
        const std::string outer = open.empty() ? std::string() : open.back().region;
        open.push_back({&e, name.rfind("seqrec::", 0) == 0 ? name : outer, 0.0});
      } else if (e.kind() == prof::EventKind::PopRange && !open.empty()) {
        const Open o = open.back();
        open.pop_back();
        const double us = o.start->cpuElapsedUs(e);
        const std::string name = o.start->name();
        for (ProfileRow* row : {&by_name[name], &by_region[{open.empty() ? std::string() : open.back().region, name}]}) {
          row->name = name;
          ++row->calls;
          row->total_us += us;
          row->self_us += us - o.children_us;
        }
        by_region[{open.empty() ? std::string() : open.back().region, name}].region =
            open.empty() ? std::string() : open.back().region;
        if (!open.empty()) open.back().children_us += us;
      }
    }
  }
  Profile out;
  for (auto& [name, row] : by_name) out.rows.push_back(row);
  for (auto& [key, row] : by_region) out.by_region.push_back(row);
  const auto by_self = [](const ProfileRow& a, const ProfileRow& b) { return a.self_us > b.self_us; };
  std::sort(out.rows.begin(), out.rows.end(), by_self);
  std::sort(out.by_region.begin(), out.by_region.end(), by_self);
  return out;
}

std::string format_profile(const Profile& profile, double wall_us, int top, int per_region) {
  const auto& rows = profile.rows;
  double self_sum = 0;
  for (const auto& r : rows) self_sum += r.self_us;
  std::string out = "  self ms   share   total ms    calls  name (ops and regions by self time)\n";
  for (int i = 0; i < top && i < static_cast<int>(rows.size()); ++i) out += row_line(rows[i], wall_us);
  char buf[256];
  std::snprintf(buf, sizeof buf, "  recorded self time %.1f ms of %.1f ms profiled (%.1f%%; the rest is outside any op)\n",
                self_sum / 1000.0, wall_us / 1000.0, wall_us > 0 ? 100.0 * self_sum / wall_us : 0.0);
  out += buf;
  std::vector<ProfileRow> regions;
  for (const auto& r : rows)
    if (r.name.rfind("seqrec::", 0) == 0) regions.push_back(r);
  std::sort(regions.begin(), regions.end(), [](const ProfileRow& a, const ProfileRow& b) { return a.total_us > b.total_us; });
  if (!regions.empty()) {
    out += "  total ms   share    self ms    calls  region\n";
    for (const auto& r : regions) {
      std::snprintf(buf, sizeof buf, "  %10.1f %6.1f%% %10.1f %8lld  %s\n", r.total_us / 1000.0,
                    wall_us > 0 ? 100.0 * r.total_us / wall_us : 0.0, r.self_us / 1000.0,
                    static_cast<long long>(r.calls), r.name.c_str());
      out += buf;
    }
  }
  if (per_region > 0) {
    std::vector<std::string> names = {""};
    for (const auto& r : regions) names.push_back(r.name);
    for (const auto& region : names) {
      std::string part;
      int n = 0;
      for (const auto& r : profile.by_region)
        if (r.region == region && n < per_region) {
          part += row_line(r, wall_us);
          ++n;
        }
      if (!part.empty())
        out += "  directly in " + (region.empty() ? std::string("no region") : region) + ", by self time:\n" + part;
    }
  }
  return out;
}

}  // namespace seqrec::train
