// Helpers shared by the files of IslandSync (not part of its interface).
#ifndef ATOLL_OUTER_ISLAND_ISLAND_SYNC_INTERNAL_H_
#define ATOLL_OUTER_ISLAND_ISLAND_SYNC_INTERNAL_H_

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace atl::outer::internal {

inline double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Runs body(lane) for lanes 0 .. n - 1 at once, lane 0 on the calling thread.
inline void RunLanes(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int lane = 1; lane < n; ++lane) threads.emplace_back(body, lane);
  body(0);
  for (auto& t : threads) t.join();
}

// Failures worth another try of the same request: the link or the service, not the request.
inline bool Transient(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDataLoss(s) || absl::IsDeadlineExceeded(s) ||
         absl::IsResourceExhausted(s);
}

inline absl::Status FirstError(const std::vector<absl::Status>& statuses) {
  for (const auto& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace atl::outer::internal

#endif  // ATOLL_OUTER_ISLAND_ISLAND_SYNC_INTERNAL_H_
