#pragma once
// Op-level profile of some training steps (`seqrec train --profile_steps N`): every Torch op,
// autograd node and SEQREC_PROFILE_SCOPE region run on the calling thread, with its calls, its
// total time and its self time (total minus the regions and ops nested in it), aggregated by name.
// Uses Torch's CPU profiler (present in LibTorch 1.13 and 2.x); with CUDA the times are the host's.
#include <cstdint>
#include <string>
#include <vector>

namespace seqrec::train {

struct ProfileRow {
  std::string name;
  std::string region;   // the innermost enclosing "seqrec::" region ("" outside all), or "" in totals
  int64_t calls = 0;
  double total_us = 0;  // inclusive; a name nested in itself counts its inner calls again
  double self_us = 0;   // exclusive of everything recorded inside it
};

struct Profile {
  std::vector<ProfileRow> rows;       // by name, largest self time first
  std::vector<ProfileRow> by_region;  // by (innermost region, name), largest self time first
};

// Starts recording on this thread. Throws if a profiler already runs on it.
void start_profile();
// Stops recording and aggregates what was recorded.
Profile stop_profile();

// A table of the profile: the `top` largest rows by self time with their share of `wall_us`
// (the profiled span), then the SEQREC_PROFILE_SCOPE regions ("seqrec::" names) by total time,
// then (when `per_region` > 0) each region's `per_region` largest ops by self time.
std::string format_profile(const Profile& profile, double wall_us, int top, int per_region = 0);

}  // namespace seqrec::train
