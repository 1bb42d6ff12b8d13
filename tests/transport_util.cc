#include "tests/transport_util.h"

#include <utility>

namespace atl::testing {

absl::StatusOr<::atollpb::v1::PushResponse> PushAll(
    outer::Transport& transport, const std::vector<::atollpb::v1::PushRequest>& requests) {
  size_t next = 0;
  return transport.Push(
      [&](::atollpb::v1::PushRequest* m) -> absl::StatusOr<bool> {
        if (next == requests.size()) return false;
        *m = requests[next++];
        return true;
      },
      0);
}

absl::StatusOr<std::vector<::atollpb::v1::StateChunk>> FetchAll(
    outer::Transport& transport, const ::atollpb::v1::FetchStateRequest& request) {
  std::vector<::atollpb::v1::StateChunk> out;
  auto s = transport.FetchState(
      request,
      [&](::atollpb::v1::StateChunk&& c) {
        out.push_back(std::move(c));
        return absl::OkStatus();
      },
      0);
  if (!s.ok()) return s;
  return out;
}

}  // namespace atl::testing
