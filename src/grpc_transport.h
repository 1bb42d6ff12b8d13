// outer::Transport over gRPC: the island's client of the coordinator. Every call carries the run
// token and a deadline (rpc_timeout_s; waiting for a round's commit gets round_timeout_s on top).
#ifndef ATOLL_SRC_GRPC_TRANSPORT_H_
#define ATOLL_SRC_GRPC_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "outer/transport.h"
#include "src/rpc_security.h"

namespace atl {

namespace pb = ::atollpb::v1;

struct GrpcTransportOptions {
  std::string target;  // host:port of the coordinator
  std::string token;
  TlsFiles tls;
  double rpc_timeout_s = 60;
  double round_timeout_s = 600;
};

class GrpcTransport : public outer::Transport {
 public:
  static absl::StatusOr<std::unique_ptr<GrpcTransport>> Create(const GrpcTransportOptions& options);
  ~GrpcTransport() override;

  absl::StatusOr<pb::JoinResponse> Join(const pb::JoinRequest& request) override;
  absl::Status Leave(const pb::LeaveRequest& request) override;
  absl::StatusOr<pb::HeartbeatResponse> Heartbeat(const pb::HeartbeatRequest& request) override;
  absl::StatusOr<pb::GetStateResponse> GetState(const pb::GetStateRequest& request);
  absl::StatusOr<pb::PushResponse> Push(const std::vector<pb::PushRequest>& requests) override;
  absl::StatusOr<std::vector<pb::UpdateChunk>> AwaitUpdate(const pb::UpdateRequest& request) override;
  absl::StatusOr<std::vector<pb::StateChunk>> FetchState(const pb::FetchStateRequest& request) override;

 private:
  struct Stubs;
  explicit GrpcTransport(const GrpcTransportOptions& options);
  void Prepare(grpc::ClientContext* context, double timeout_s) const;
  GrpcTransportOptions options_;
  std::unique_ptr<Stubs> stubs_;
};

}  // namespace atl

#endif  // ATOLL_SRC_GRPC_TRANSPORT_H_
