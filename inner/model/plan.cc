#include "inner/model/plan.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace atl::inner {
namespace {

// The block of "<blocks>.<l>.<rest>" and the module name with the index as "*", or -1.
int BlockOf(const ParallelPlan& plan, const std::string& module, std::string* pattern) {
  const std::string prefix = plan.blocks + ".";
  *pattern = module;
  if (!absl::StartsWith(module, prefix)) return -1;
  // "<blocks>.<l>" (a parameter directly on the block) or "<blocks>.<l>.<rest>".
  const size_t end = std::min(module.find('.', prefix.size()), module.size());
  int l;
  if (!absl::SimpleAtoi(module.substr(prefix.size(), end - prefix.size()), &l) || l < 0) return -1;
  *pattern = absl::StrCat(prefix, "*", module.substr(end));
  return l;
}

bool IsEmbedding(const ParallelPlan& plan, const std::string& param) {
  return std::any_of(plan.embeddings.begin(), plan.embeddings.end(), [&](const std::string& e) {
    return absl::StartsWith(param, e + ".");
  });
}

}  // namespace

ParamPlan PlanOf(const ParallelPlan& plan, const std::string& param) {
  const size_t dot = param.rfind('.');
  const std::string module = dot == std::string::npos ? "" : param.substr(0, dot);
  const std::string leaf = dot == std::string::npos ? param : param.substr(dot + 1);
  std::string pattern;
  ParamPlan p;
  p.block = BlockOf(plan, module, &pattern);
  for (const TpRule& rule : plan.tensor_parallel) {
    if (rule.module != pattern) continue;
    // A row-parallel layer's bias is whole: added once, after the partial products are summed.
    if (rule.style == TpStyle::kRow && leaf != "weight") break;
    p.style = rule.style;
    p.parts = rule.parts;
    p.input_major = rule.style == TpStyle::kRow;
    break;
  }
  p.sequence_partial = p.block >= 0 && p.style == TpStyle::kReplicated;
  return p;
}

int UnitOf(const ParallelPlan& plan, const std::string& param, int n_layer) {
  const int block = PlanOf(plan, param).block;
  if (block >= 0) return 1 + block;
  return IsEmbedding(plan, param) ? 0 : n_layer + 1;
}

std::vector<int> FragmentGroups(const ParallelPlan& plan, const std::vector<std::string>& names) {
  int layers = 0;
  std::vector<int> blocks;
  for (const auto& n : names) {
    blocks.push_back(PlanOf(plan, n).block);
    layers = std::max(layers, blocks.back() + 1);
  }
  std::vector<int> groups;
  for (size_t i = 0; i < names.size(); ++i) {
    if (layers == 0) {
      groups.push_back(-1);
    } else if (blocks[i] >= 0) {
      groups.push_back(blocks[i]);
    } else {
      groups.push_back(IsEmbedding(plan, names[i]) ? 0 : layers - 1);
    }
  }
  return groups;
}

std::vector<int64_t> TpLocalShape(const ParamPlan& p, const std::vector<int64_t>& shape,
                                  int size) {
  std::vector<int64_t> local = shape;
  if (p.style == TpStyle::kReplicated) return local;
  local[p.input_major ? 1 : 0] /= size;
  return local;
}

std::vector<std::pair<int64_t, int64_t>> TpRanges(const ParamPlan& p,
                                                   const std::vector<int64_t>& shape, int rank,
                                                   int size) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (p.style == TpStyle::kReplicated) return {{0, numel}};
  // Rows of the canonical order: output rows, or (input-major) input columns.
  const int64_t rows = p.input_major ? shape[1] : shape[0];
  const int64_t row = numel / rows, per_part = rows / p.parts, mine = per_part / size;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int part = 0; part < p.parts; ++part) {
    ranges.emplace_back((part * per_part + rank * mine) * row, mine * row);
  }
  return ranges;
}

}  // namespace atl::inner
