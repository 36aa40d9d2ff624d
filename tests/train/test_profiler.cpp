// The op profile behind `seqrec train --profile_steps`: Torch ops and SEQREC_PROFILE_SCOPE
// regions are counted, timed and nested (self = total minus what ran inside), and attributed to
// their innermost region.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "ops/profile_scope.h"
#include "train/profiler.h"

namespace {
using seqrec::train::ProfileRow;

const ProfileRow* find(const std::vector<ProfileRow>& rows, const std::string& name, const std::string& region = "") {
  for (const auto& r : rows)
    if (r.name == name && r.region == region) return &r;
  return nullptr;
}

TEST(Profiler, CountsNestsAndAttributesToRegions) {
  auto x = torch::randn({64, 64}), y = torch::randn({64, 64});
  seqrec::train::start_profile();
  EXPECT_THROW(seqrec::train::start_profile(), std::runtime_error);
  {
    SEQREC_PROFILE_SCOPE("seqrec::outer");
    for (int i = 0; i < 3; ++i) x = torch::mm(x, y).tanh();
    {
      SEQREC_PROFILE_SCOPE("seqrec::inner");
      for (int i = 0; i < 2; ++i) x = torch::mm(x, y);
    }
  }
  x = torch::mm(x, y);  // outside every region
  const auto profile = seqrec::train::stop_profile();

  const auto* mm = find(profile.rows, "aten::mm");
  ASSERT_NE(mm, nullptr);
  EXPECT_EQ(mm->calls, 6);
  EXPECT_GT(mm->self_us, 0);
  EXPECT_LE(mm->self_us, mm->total_us + 1e-9);
  const auto* outer = find(profile.rows, "seqrec::outer");
  const auto* inner = find(profile.rows, "seqrec::inner");
  ASSERT_NE(outer, nullptr);
  ASSERT_NE(inner, nullptr);
  EXPECT_EQ(outer->calls, 1);
  EXPECT_GE(outer->total_us, inner->total_us);
  EXPECT_LT(outer->self_us, outer->total_us) << "the ops inside are not its own time";
  // Rows sorted by self time, largest first.
  for (size_t i = 1; i < profile.rows.size(); ++i) EXPECT_GE(profile.rows[i - 1].self_us, profile.rows[i].self_us);

  // By innermost region: 3 products directly in outer, 2 in inner, 1 in none; inner is in outer.
  ASSERT_NE(find(profile.by_region, "aten::mm", "seqrec::outer"), nullptr);
  EXPECT_EQ(find(profile.by_region, "aten::mm", "seqrec::outer")->calls, 3);
  EXPECT_EQ(find(profile.by_region, "aten::mm", "seqrec::inner")->calls, 2);
  EXPECT_EQ(find(profile.by_region, "aten::mm", "")->calls, 1);
  EXPECT_EQ(find(profile.by_region, "aten::tanh", "seqrec::outer")->calls, 3);
  EXPECT_EQ(find(profile.by_region, "seqrec::inner", "seqrec::outer")->calls, 1);

  const std::string text = seqrec::train::format_profile(profile, outer->total_us * 2, 5, 3);
  EXPECT_NE(text.find("aten::mm"), std::string::npos) << text;
  EXPECT_NE(text.find("  region\n"), std::string::npos) << text;
  EXPECT_NE(text.find("directly in seqrec::inner, by self time:"), std::string::npos) << text;
  EXPECT_NE(text.find("directly in no region, by self time:"), std::string::npos) << text;

  // Stopped: nothing more is recorded, and a new profile starts empty.
  seqrec::train::start_profile();
  const auto empty = seqrec::train::stop_profile();
  EXPECT_EQ(find(empty.rows, "aten::mm"), nullptr);
}

}  // namespace
