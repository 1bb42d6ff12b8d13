#include "outer/base/fragments.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "compression/config_value.h"
#include "compression/status_macros.h"

namespace atl::outer {
namespace {

constexpr EnumName<FragmentPattern> kPatterns[] = {{FragmentPattern::kStrided, "strided"},
                                                   {FragmentPattern::kSequential, "sequential"}};

}  // namespace

absl::StatusOr<FragmentPattern> ParseFragmentPattern(const std::string& name) {
  FragmentPattern pattern;
  ATL_RETURN_IF_ERROR(ParseConfigValue(name, &pattern));
  return pattern;
}

absl::Status ParseConfigValue(const std::string& text, FragmentPattern* value) {
  return ParseEnumValue(text, kPatterns, value);
}

std::string ConfigValueText(FragmentPattern value) { return EnumValueName(value, kPatterns); }

absl::StatusOr<FragmentPlan> PlanFragments(const std::vector<int>& groups, int num_fragments,
                                           FragmentPattern pattern) {
  int layers = 0;
  for (int g : groups) layers = std::max(layers, g + 1);
  if (num_fragments < 1 || num_fragments > std::max(1, layers)) {
    return absl::InvalidArgumentError(absl::StrCat("outer.num_fragments must be in [1, ",
                                                   std::max(1, layers), "] (one block at least per "
                                                   "fragment), got ", num_fragments));
  }
  FragmentPlan plan;
  plan.parameters.resize(size_t(num_fragments));
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i] < -1) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", i, " has no fragment group (", groups[i], ")"));
    }
    const int l = std::max(0, groups[i]);
    const uint32_t f = pattern == FragmentPattern::kStrided
                           ? uint32_t(l % num_fragments)
                           : uint32_t(int64_t(l) * num_fragments / std::max(1, layers));
    plan.fragment_of.push_back(f);
    plan.parameters[f].push_back(i);
  }
  return plan;
}

std::vector<int> ContiguousGroups(const std::vector<uint64_t>& numels, int num_fragments) {
  const int p = std::max(1, num_fragments);
  long double total = 0;
  for (uint64_t n : numels) total += (long double)n;
  std::vector<int> groups;
  long double before = 0;
  int last = -1;
  int next = -1;  // consecutive group numbers: runs that meet no parameter's midpoint are skipped
  for (uint64_t n : numels) {
    const long double mid = before + (long double)n / 2;
    const int run = total > 0 ? std::min(p - 1, int(mid * p / total)) : 0;
    if (run != last) {
      last = run;
      ++next;
    }
    groups.push_back(next);
    before += (long double)n;
  }
  return groups;
}

SyncSchedule::SyncSchedule(int sync_every, int num_fragments, SyncPhases phases)
    : h_(std::max(1, sync_every)), p_(std::max(1, num_fragments)), phases_(phases) {
  phases_.warm_start_steps = std::max<int64_t>(0, phases_.warm_start_steps);
  if (phases_.early_sync_every < 1 || phases_.early_sync_steps < 1) {
    phases_.early_sync_every = 0;
    phases_.early_sync_steps = 0;
  }
  early_end_ = phases_.warm_start_steps + phases_.early_sync_steps;
  early_rounds_ = uint64_t(phases_.warm_start_steps) +
                  (phases_.early_sync_every > 0
                       ? uint64_t(phases_.early_sync_steps / phases_.early_sync_every)
                       : 0);
}

int SyncSchedule::offset(int fragment) const { return int(int64_t(fragment) * h_ / p_); }

int64_t SyncSchedule::DueStep(int fragment, uint64_t round) const {
  const uint64_t warm = warm_start_rounds();
  if (round < warm) return int64_t(round) + 1;
  if (round < early_rounds_) {
    return phases_.warm_start_steps + int64_t(round - warm + 1) * phases_.early_sync_every;
  }
  round -= early_rounds_;
  const int64_t t = offset(fragment);
  return early_end_ + (t == 0 ? int64_t(round) + 1 : int64_t(round)) * h_ + t;
}

int64_t SyncSchedule::NextDue(int fragment, int64_t step) const {
  step = std::max<int64_t>(0, step);
  if (step < phases_.warm_start_steps) return step + 1;
  if (step < early_end_) {
    const int64_t h = phases_.early_sync_every;
    return phases_.warm_start_steps + ((step - phases_.warm_start_steps) / h + 1) * h;
  }
  const int64_t late = step - early_end_, t = offset(fragment);
  // The smallest x > late with x = t (mod H), x > 0.
  const int64_t x = late < t ? t : t + ((late - t) / h_ + 1) * h_;
  return early_end_ + x;
}

uint64_t SyncSchedule::RoundsUntil(int fragment, int64_t steps) const {
  if (steps <= 0) return 0;
  if (steps <= phases_.warm_start_steps) return uint64_t(steps);
  if (steps <= early_end_) {
    return warm_start_rounds() +
           uint64_t((steps - phases_.warm_start_steps) / phases_.early_sync_every);
  }
  const int64_t late = steps - early_end_, t = offset(fragment);
  const int64_t rounds = t == 0 ? late / h_ : (late < t ? 0 : (late - t) / h_ + 1);
  return early_rounds_ + uint64_t(rounds);
}

int64_t SyncSchedule::RoundStart(int fragment, uint64_t round) const {
  return round == 0 ? 0 : DueStep(fragment, round - 1);
}

int64_t SyncSchedule::ResumeStep(const std::vector<uint64_t>& rounds) const {
  int64_t latest_start = 0, earliest_start = INT64_MAX, earliest_due = INT64_MAX;
  for (int f = 0; f < int(rounds.size()) && f < p_; ++f) {
    const int64_t due = DueStep(f, rounds[size_t(f)]);
    const int64_t start = RoundStart(f, rounds[size_t(f)]);
    latest_start = std::max(latest_start, start);
    earliest_start = std::min(earliest_start, start);
    earliest_due = std::min(earliest_due, due);
  }
  if (earliest_start == INT64_MAX) return 0;
  return latest_start < earliest_due ? latest_start : earliest_start;
}

std::vector<uint32_t> SyncSchedule::DueAfter(int64_t step) const {
  std::vector<uint32_t> due;
  if (step <= 0) return due;
  if (step <= early_end_) {
    if (step <= phases_.warm_start_steps ||
        (step - phases_.warm_start_steps) % phases_.early_sync_every == 0) {
      for (int p = 0; p < p_; ++p) due.push_back(uint32_t(p));
    }
    return due;
  }
  const int64_t late = step - early_end_;
  for (int p = 0; p < p_; ++p) {
    if ((late - offset(p)) % h_ == 0) due.push_back(uint32_t(p));
  }
  return due;
}

absl::Status Validate(const SyncPhases& phases) {
  if (phases.warm_start_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.warm_start_steps must be >= 0, got ", phases.warm_start_steps));
  }
  if (phases.early_sync_every < 0 || phases.early_sync_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.early_sync_every and outer.early_sync_steps must be >= 0, got ",
        phases.early_sync_every, " and ", phases.early_sync_steps));
  }
  if (phases.early_sync_every > 0 && phases.early_sync_steps == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.early_sync_every = ", phases.early_sync_every,
        " needs outer.early_sync_steps: how many steps it holds"));
  }
  if (phases.early_sync_every > 0 && phases.early_sync_steps % phases.early_sync_every != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.early_sync_steps (", phases.early_sync_steps,
        ") must be a multiple of outer.early_sync_every (", phases.early_sync_every, ")"));
  }
  return absl::OkStatus();
}

}  // namespace atl::outer
