// Multi-rank tests: runs a body in N forked processes that form one island (c10d over loopback),
// and collects each rank's exit code. Results travel through files in a temporary directory.
#ifndef ATOLL_TESTS_RANK_UTIL_H_
#define ATOLL_TESTS_RANK_UTIL_H_

#include <functional>
#include <vector>

#include "inner/parallel/communicator.h"

namespace atl::testing {

// A TCP port that was free a moment ago.
int FreePort();

// Forks `n` processes; rank r runs body(info) with RANK/WORLD_SIZE semantics in `info` and exits
// with its return value (a thrown exception or a crash is a non-zero exit). Waits at most
// `timeout_s`, then kills what is left (exit code -1). Returns the exit codes by rank.
std::vector<int> RunRanks(int n, const std::function<int(const inner::parallel::RankInfo&)>& body,
                          double timeout_s = 120);

}  // namespace atl::testing

#endif  // ATOLL_TESTS_RANK_UTIL_H_
