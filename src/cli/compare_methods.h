// The rows of `atoll compare` (compare.methods): what each method is and what it changes of the
// compare's config. A method is a family and, for the families that take one, a codec:
//   baseline           one island with the islands' global batch (the centralized baseline)
//   diloco[_<codec>]   the config's outer settings (with that codec)
//   streaming_<codec>  Streaming DiLoCo: the config's outer.num_fragments (4 when it is 1, at most
//                      one block per fragment), tau = 1, alpha = 0.5
//   sparse_<codec>     SparseLoCo: the config's outer.topk_density (1% if it has none), values in
//                      <codec>, error feedback, outer SGD
//   async              async DiLoCo (delayed Nesterov, dynamic local steps) with the config's
//                      settings (its warm start too: every island pushes each of its first
//                      steps), less those that schedule sync rounds (said in the plan)
#ifndef ATOLL_SRC_CLI_COMPARE_METHODS_H_
#define ATOLL_SRC_CLI_COMPARE_METHODS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/config/config.h"

namespace atl {

enum class MethodKind { kBaseline, kDiloco, kStreaming, kSparse, kAsync };

struct Method {
  MethodKind kind = MethodKind::kDiloco;
  std::string codec;  // empty: the config's
  std::string name;   // as compare.methods writes it: its run directory and report row
};

// One method named as compare.methods writes it; INVALID_ARGUMENT naming the valid ones.
absl::StatusOr<Method> ParseMethod(const std::string& text);
// compare.methods: a comma-separated list.
absl::StatusOr<std::vector<Method>> ParseMethods(const std::string& list);

// What a method changes of the compare's config (`config`: the run's, before the changes).
struct MethodChanges {
  std::vector<Override> overrides;
  std::vector<std::string> notes;  // what the plan says of keys that cannot apply
};
MethodChanges ChangesOf(const Method& method, const Config& config);

}  // namespace atl

#endif  // ATOLL_SRC_CLI_COMPARE_METHODS_H_
