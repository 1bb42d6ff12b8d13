#include "src/net/grpc_transport.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "atoll/v1/outer.grpc.pb.h"
#include "compression/status_macros.h"

namespace atl {
namespace {

// Hands each message of a server stream to `sink`; a sink's error cancels the call and is returned.
template <typename Response, typename Reader>
absl::Status ReadInto(grpc::ClientContext& context, Reader& reader,
                      const outer::ChunkSink<Response>& sink) {
  Response r;
  absl::Status taken;
  while (taken.ok() && reader->Read(&r)) {
    taken = sink(std::move(r));
    r.Clear();
  }
  if (!taken.ok()) {
    context.TryCancel();
    reader->Finish().ok();  // ends the call; its status is the cancellation
    return taken;
  }
  return FromGrpc(reader->Finish());
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
  ATL_ASSIGN_OR_RETURN(auto creds, ChannelCredentials(options.tls));
  if (options.connections < 1 || options.connections > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("connections must be in 1..256, got ", options.connections));
  }
  std::unique_ptr<GrpcTransport> t(new GrpcTransport(options));
  auto connect = [&] {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(16 << 20);
    // Each channel its own subchannel pool: its own TCP connection, shared with no other channel.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel = grpc::CreateCustomChannel(options.target, creds, args);
    auto stubs = std::make_unique<Stubs>();
    stubs->coordinator = pb::Coordinator::NewStub(channel);
    stubs->outer_sync = pb::OuterSync::NewStub(channel);
    return stubs;
  };
  // Membership calls (joins, heartbeats, leaves, state queries) on a connection of their own: a
  // lease never waits behind a push's megabytes in a connection's queue.
  t->control_ = connect();
  for (int i = 0; i < options.connections; ++i) t->stubs_.push_back(connect());
  return t;
}

const GrpcTransport::Stubs& GrpcTransport::Lane(int lane) const {
  return *stubs_[size_t(lane < 0 ? 0 : lane) % stubs_.size()];
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
  ATL_RETURN_IF_ERROR(FromGrpc(control_->coordinator->Join(&ctx, request, &response)));
  return response;
}

absl::Status GrpcTransport::Leave(const pb::LeaveRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout_s);
  pb::LeaveResponse response;
  return FromGrpc(control_->coordinator->Leave(&ctx, request, &response));
}

absl::StatusOr<pb::HeartbeatResponse> GrpcTransport::Heartbeat(const pb::HeartbeatRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout_s);
  pb::HeartbeatResponse response;
  ATL_RETURN_IF_ERROR(FromGrpc(control_->coordinator->Heartbeat(&ctx, request, &response)));
  return response;
}

absl::StatusOr<pb::ShardSyncResponse> GrpcTransport::ShardSync(
    const pb::ShardSyncRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout_s + 1);
  ctx.set_wait_for_ready(true);  // a coordinator that is (re)starting
  pb::ShardSyncResponse response;
  ATL_RETURN_IF_ERROR(FromGrpc(control_->coordinator->ShardSync(&ctx, request, &response)));
  return response;
}

absl::StatusOr<pb::GetStateResponse> GrpcTransport::GetState(const pb::GetStateRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout_s);
  pb::GetStateResponse response;
  ATL_RETURN_IF_ERROR(FromGrpc(control_->coordinator->GetState(&ctx, request, &response)));
  return response;
}

absl::StatusOr<pb::PushResponse> GrpcTransport::Push(const outer::PushSource& source, int lane) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout_s);
  pb::PushResponse response;
  auto writer = Lane(lane).outer_sync->Push(&ctx, &response);
  pb::PushRequest r;
  while (true) {
    r.Clear();
    auto more = source(&r);
    if (!more.ok()) {
      ctx.TryCancel();  // the service discards what it received
      writer->Finish().ok();
      return more.status();
    }
    if (!*more || !writer->Write(r)) break;  // a failed write: the server ended the call
  }
  writer->WritesDone();
  ATL_RETURN_IF_ERROR(FromGrpc(writer->Finish()));
  return response;
}

absl::Status GrpcTransport::AwaitUpdate(const pb::UpdateRequest& request,
                                        const outer::ChunkSink<pb::UpdateChunk>& sink, int lane) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout_s + options_.round_timeout_s);
  auto reader = Lane(lane).outer_sync->AwaitUpdate(&ctx, request);
  return ReadInto<pb::UpdateChunk>(ctx, reader, sink);
}

absl::Status GrpcTransport::FetchState(const pb::FetchStateRequest& request,
                                       const outer::ChunkSink<pb::StateChunk>& sink, int lane) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.rpc_timeout_s);
  auto reader = Lane(lane).outer_sync->FetchState(&ctx, request);
  return ReadInto<pb::StateChunk>(ctx, reader, sink);
}

}  // namespace atl
