#include "src/grpc_transport.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "atoll/v1/outer.grpc.pb.h"

namespace atl {
namespace {

template <typename Response, typename Reader>
absl::StatusOr<std::vector<Response>> ReadAll(Reader& reader) {
  std::vector<Response> out;
  Response r;
  while (reader->Read(&r)) out.push_back(std::move(r));
  if (auto s = FromGrpc(reader->Finish()); !s.ok()) return s;
  return out;
}

}  // namespace

struct GrpcTransport::Stubs {
  std::unique_ptr<pb::Coordinator::Stub> coordinator;
  std::unique_ptr<pb::OuterSync::Stub> outer_sync;
};

GrpcTransport::GrpcTransport(const GrpcTransportOptions& options) : options_(options) {}
GrpcTransport::~GrpcTransport() = default;

absl::StatusOr<std::unique_ptr<GrpcTransport>> GrpcTransport::Create(
    const GrpcTransportOptions& options) {
  auto creds = ChannelCredentials(options.tls);
  if (!creds.ok()) return creds.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  auto channel = grpc::CreateCustomChannel(options.target, *creds, args);
  std::unique_ptr<GrpcTransport> t(new GrpcTransport(options));
  t->stubs_ = std::make_unique<Stubs>();
  t->stubs_->coordinator = pb::Coordinator::NewStub(channel);
  t->stubs_->outer_sync = pb::OuterSync::NewStub(channel);
  return t;
}

void GrpcTransport::Prepare(grpc::ClientContext* context, double timeout_s) const {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(int64_t(timeout_s * 1000)));
  context->AddMetadata(kAuthMetadata, "Bearer " + options_.token);
}

absl::StatusOr<pb::JoinResponse> GrpcTransport::Join(const pb::JoinRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout_s);
  // Wait for a coordinator that is still starting, within the deadline.
  ctx.set_wait_for_ready(true);
  pb::JoinResponse response;
  if (auto s = FromGrpc(stubs_->coordinator->Join(&ctx, request, &response)); !s.ok()) return s;
  return response;
}

absl::Status GrpcTransport::Leave(const pb::LeaveRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout_s);
  pb::LeaveResponse response;
  return FromGrpc(stubs_->coordinator->Leave(&ctx, request, &response));
}

absl::StatusOr<pb::HeartbeatResponse> GrpcTransport::Heartbeat(const pb::HeartbeatRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout_s);
  pb::HeartbeatResponse response;
  if (auto s = FromGrpc(stubs_->coordinator->Heartbeat(&ctx, request, &response)); !s.ok()) return s;
  return response;
}

absl::StatusOr<pb::GetStateResponse> GrpcTransport::GetState(const pb::GetStateRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout_s);
  pb::GetStateResponse response;
  if (auto s = FromGrpc(stubs_->coordinator->GetState(&ctx, request, &response)); !s.ok()) return s;
  return response;
}

absl::StatusOr<pb::PushResponse> GrpcTransport::Push(const std::vector<pb::PushRequest>& requests) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout_s);
  pb::PushResponse response;
  auto writer = stubs_->outer_sync->Push(&ctx, &response);
  for (const auto& r : requests) {
    if (!writer->Write(r)) break;  // the server ended the call; Finish() says why
  }
  writer->WritesDone();
  if (auto s = FromGrpc(writer->Finish()); !s.ok()) return s;
  return response;
}

absl::StatusOr<std::vector<pb::UpdateChunk>> GrpcTransport::AwaitUpdate(
    const pb::UpdateRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout_s + options_.round_timeout_s);
  auto reader = stubs_->outer_sync->AwaitUpdate(&ctx, request);
  return ReadAll<pb::UpdateChunk>(reader);
}

absl::StatusOr<std::vector<pb::StateChunk>> GrpcTransport::FetchState(
    const pb::FetchStateRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout_s);
  auto reader = stubs_->outer_sync->FetchState(&ctx, request);
  return ReadAll<pb::StateChunk>(reader);
}

}  // namespace atl
