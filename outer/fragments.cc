#include "outer/fragments.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace atl::outer {
namespace {

// Block index of "blocks.<l>.<rest>", or -1.
int BlockOf(const std::string& name) {
  if (!absl::StartsWith(name, "blocks.")) return -1;
  const size_t end = name.find('.', 7);
  int l;
  if (end == std::string::npos || !absl::SimpleAtoi(name.substr(7, end - 7), &l) || l < 0) return -1;
  return l;
}

}  // namespace

absl::StatusOr<FragmentPattern> ParseFragmentPattern(const std::string& name) {
  if (name == "strided") return FragmentPattern::kStrided;
  if (name == "sequential") return FragmentPattern::kSequential;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown fragment pattern '", name, "' (strided or sequential)"));
}

absl::StatusOr<FragmentPlan> PlanFragments(const std::vector<std::string>& names,
                                           int num_fragments, FragmentPattern pattern) {
  int layers = 0;
  for (const auto& n : names) layers = std::max(layers, BlockOf(n) + 1);
  if (num_fragments < 1 || num_fragments > std::max(1, layers)) {
    return absl::InvalidArgumentError(absl::StrCat("outer.num_fragments must be in [1, ",
                                                   std::max(1, layers), "] (one block at least per "
                                                   "fragment), got ", num_fragments));
  }
  auto fragment_of_block = [&](int l) -> uint32_t {
    if (pattern == FragmentPattern::kStrided) return uint32_t(l % num_fragments);
    return uint32_t(int64_t(l) * num_fragments / layers);
  };
  FragmentPlan plan;
  plan.parameters.resize(size_t(num_fragments));
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    const int l = BlockOf(n);
    uint32_t f;
    if (l >= 0) {
      f = fragment_of_block(l);
    } else if (absl::StartsWith(n, "tok_emb.") || absl::StartsWith(n, "pos_emb.")) {
      f = layers > 0 ? fragment_of_block(0) : 0;
    } else if (absl::StartsWith(n, "ln_f.") || absl::StartsWith(n, "head.")) {
      f = layers > 0 ? fragment_of_block(layers - 1) : 0;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", n, "' has no fragment under the placement rule"));
    }
    plan.fragment_of.push_back(f);
    plan.parameters[f].push_back(i);
  }
  return plan;
}

SyncSchedule::SyncSchedule(int sync_every, int num_fragments)
    : h_(std::max(1, sync_every)), p_(std::max(1, num_fragments)) {}

int SyncSchedule::offset(int fragment) const { return int(int64_t(fragment) * h_ / p_); }

int64_t SyncSchedule::DueStep(int fragment, uint64_t round) const {
  const int64_t t = offset(fragment);
  return (t == 0 ? int64_t(round) + 1 : int64_t(round)) * h_ + t;
}

int64_t SyncSchedule::ResumeStep(const std::vector<uint64_t>& rounds) const {
  int64_t latest_start = 0, earliest_start = INT64_MAX, earliest_due = INT64_MAX;
  for (int f = 0; f < int(rounds.size()) && f < p_; ++f) {
    const int64_t due = DueStep(f, rounds[size_t(f)]);
    const int64_t start = std::max<int64_t>(0, due - h_);
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
  for (int p = 0; p < p_; ++p) {
    if ((step - offset(p)) % h_ == 0) due.push_back(uint32_t(p));
  }
  return due;
}

}  // namespace atl::outer
