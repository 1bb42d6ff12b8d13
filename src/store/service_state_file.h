// The coordinator's durable state file (format: proto/atoll/v1/service_state.proto): written and
// read tensor by tensor, so that a state of many GB is never held twice, checked section by section
// (the footer's checksum, each tensor's XXH64, every size against the service's own), and written
// atomically (a crash leaves the previous file).
#ifndef ATOLL_SRC_STORE_SERVICE_STATE_FILE_H_
#define ATOLL_SRC_STORE_SERVICE_STATE_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "atoll/v1/service_state.pb.h"
#include "outer/service/sync_server.h"

namespace atl {

// Writes the state of `server` to `path`; returns its description (for SyncServer::MarkDurable).
absl::StatusOr<::atollpb::v1::ServiceState> WriteServiceState(const std::string& path,
                                                              const outer::SyncServer& server);
// Restores `server` from the file at `path` (format 3, or formats 2 and 1 of earlier versions): all or
// nothing. Returns the description of what was restored.
absl::StatusOr<::atollpb::v1::ServiceState> RestoreServiceState(const std::string& path,
                                                                outer::SyncServer& server);
// Reads a state file whole, the tensors in the message's bytes fields (tests and tools; the file's
// own size bounds the memory).
absl::StatusOr<::atollpb::v1::ServiceState> ReadServiceState(const std::string& path);

}  // namespace atl

#endif  // ATOLL_SRC_STORE_SERVICE_STATE_FILE_H_
