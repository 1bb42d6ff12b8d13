// Calls on an outer::Transport with whole payloads, for tests (torch-free: the outer tests use
// them): a push of these messages; the chunks of a state transfer, collected.
#ifndef ATOLL_TESTS_TRANSPORT_UTIL_H_
#define ATOLL_TESTS_TRANSPORT_UTIL_H_

#include <vector>

#include "absl/status/statusor.h"
#include "outer/base/transport.h"

namespace atl::testing {

absl::StatusOr<::atollpb::v1::PushResponse> PushAll(
    outer::Transport& transport, const std::vector<::atollpb::v1::PushRequest>& requests);
absl::StatusOr<std::vector<::atollpb::v1::StateChunk>> FetchAll(
    outer::Transport& transport, const ::atollpb::v1::FetchStateRequest& request);

}  // namespace atl::testing

#endif  // ATOLL_TESTS_TRANSPORT_UTIL_H_
