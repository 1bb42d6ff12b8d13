#include "src/net/grpc_transport.h"

#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "atoll/v1/outer.grpc.pb.h"
#include "compression/status_macros.h"
#include "outer/island/shard_router.h"

namespace atl {
namespace {

// A call's status. The transport returns its own status for the calls it cancels itself, so a
// CANCELLED call is the coordinator's doing: it shut down or restarted during the call (gRPC's
// Server::Shutdown cancels what is pending), or ended a stream idle past its limit. Either is a
// passing failure, retried like a lost connection.
absl::Status CallStatus(const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::CANCELLED) {
    return absl::UnavailableError(absl::StrCat(
        "the coordinator ended the call (it is shutting down or restarting, or the stream was idle "
        "past outer.stream_idle_timeout_s): ", s.error_message()));
  }
  return FromGrpc(s);
}

// A failed membership call's status with its likely cause, in words a person can act on, before
// gRPC's own text.
absl::Status Explained(const grpc::Status& s, const std::string& target) {
  if (s.ok()) return absl::OkStatus();
  const std::string m = absl::AsciiStrToLower(s.error_message());
  const auto has = [&m](std::initializer_list<const char*> words) {
    for (const char* w : words) {
      if (absl::StrContains(m, w)) return true;
    }
    return false;
  };
  std::string cause;
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    if (has({"connection refused"})) {
      cause = absl::StrCat("connection refused: nothing listens on ", target,
                           " (is the coordinator running, and is this its address and port?)");
    } else if (has({"ssl", "tls", "certificate", "handshake failed"})) {
      cause = absl::StrCat("the TLS handshake with ", target, " failed (do both sides use TLS, and "
                           "does --tls-ca hold the root of the coordinator's certificate?)");
    } else if (has({"dns", "resolve", "resolution", "name or service"})) {
      cause = absl::StrCat("the host of ", target, " does not resolve (a typo in --coordinator?)");
    } else if (has({"unreachable", "no route", "timed out", "timeout", "deadline"})) {
      cause = absl::StrCat(target, " is unreachable (a wrong host, a firewall, or no route)");
    } else {
      cause = absl::StrCat("no connection to ", target);
    }
  } else if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    cause = "the coordinator refused the run token (does --token-file or $ATOLL_TOKEN hold its token?)";
  } else if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    cause = absl::StrCat("no answer from ", target, " within outer.rpc_timeout_s");
  }
  if (cause.empty()) return CallStatus(s);
  return absl::Status(absl::StatusCode(int(s.error_code())),
                      absl::StrCat(cause, " [", s.error_message(), "]"));
}

}  // namespace

struct GrpcTransport::Stubs {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Coordinator::Stub> coordinator;
  std::unique_ptr<pb::OuterSync::Stub> outer_sync;
};

// A call's context, with its deadline and token, known to the transport while the call runs so
// that Cancel can end it. A call that starts after Cancel ends at once.
class GrpcTransport::Call {
 public:
  Call(GrpcTransport& transport, double timeout_s) : transport_(transport) {
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(int64_t(timeout_s * 1000)));
    context.AddMetadata(kAuthMetadata, "Bearer " + transport.options_.token);
    std::lock_guard<std::mutex> lock(transport.calls_mu_);
    if (transport.cancelled_) context.TryCancel();
    transport.calls_.insert(&context);
  }
  ~Call() {
    std::lock_guard<std::mutex> lock(transport_.calls_mu_);
    transport_.calls_.erase(&context);
  }

  // The call's status: CANCELLED where the transport ended it, else as CallStatus reads it (or,
  // for a membership call, Explained).
  absl::Status Status(const grpc::Status& s) const {
    return Ours(s) ? Cancelled() : CallStatus(s);
  }
  absl::Status Explained(const grpc::Status& s) const {
    return Ours(s) ? Cancelled() : atl::Explained(s, transport_.options_.target);
  }

  // Hands each message of a server stream to `sink`; a sink's error cancels the call and is
  // returned.
  template <typename Response, typename Reader>
  absl::Status ReadInto(Reader& reader, const outer::ChunkSink<Response>& sink) {
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
    return Status(reader->Finish());
  }

  grpc::ClientContext context;

 private:
  bool Ours(const grpc::Status& s) const {
    std::lock_guard<std::mutex> lock(transport_.calls_mu_);
    return transport_.cancelled_ && s.error_code() == grpc::StatusCode::CANCELLED;
  }
  static absl::Status Cancelled() {
    return absl::CancelledError("the island is leaving without waiting: its call was ended");
  }

  GrpcTransport& transport_;
};

GrpcTransport::GrpcTransport(const GrpcTransportOptions& options) : options_(options) {}
GrpcTransport::~GrpcTransport() = default;

void GrpcTransport::Cancel() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  cancelled_ = true;
  for (grpc::ClientContext* context : calls_) context->TryCancel();
}

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
    // A coordinator that comes (back) up is found within seconds: gRPC's own reconnect backoff
    // would grow to 2 minutes, longer than an island retries its join. (Not
    // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: it is also each connection attempt's deadline, and 20 s
    // is right for a loaded host.)
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    auto channel = grpc::CreateCustomChannel(options.target, creds, args);
    auto stubs = std::make_unique<Stubs>();
    stubs->channel = channel;
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

absl::StatusOr<pb::JoinResponse> GrpcTransport::Join(const pb::JoinRequest& request) {
  // A coordinator that is starting or restarting: the connection is waited for a little (which
  // drives gRPC's attempts); not there by then, the call fails at once with the connection's error
  // (UNAVAILABLE, with its cause), and the island's retries say so and try again.
  constexpr double kConnectWaitS = 2;
  const bool connected =
      control_->channel->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY ||
      control_->channel->WaitForConnected(std::chrono::system_clock::now() +
                                          std::chrono::milliseconds(int64_t(kConnectWaitS * 1000)));
  Call call(*this, options_.rpc_timeout_s);
  call.context.set_wait_for_ready(connected);  // a connection that drops now is waited for, as before
  pb::JoinResponse response;
  ATL_RETURN_IF_ERROR(call.Explained(control_->coordinator->Join(&call.context, request, &response)));
  return response;
}

absl::Status GrpcTransport::Leave(const pb::LeaveRequest& request) {
  Call call(*this, options_.rpc_timeout_s);
  pb::LeaveResponse response;
  return call.Status(control_->coordinator->Leave(&call.context, request, &response));
}

absl::StatusOr<pb::HeartbeatResponse> GrpcTransport::Heartbeat(const pb::HeartbeatRequest& request) {
  Call call(*this, options_.rpc_timeout_s);
  pb::HeartbeatResponse response;
  ATL_RETURN_IF_ERROR(call.Explained(control_->coordinator->Heartbeat(&call.context, request, &response)));
  return response;
}

absl::StatusOr<pb::ShardSyncResponse> GrpcTransport::ShardSync(
    const pb::ShardSyncRequest& request) {
  Call call(*this, options_.rpc_timeout_s + 1);
  call.context.set_wait_for_ready(true);  // a coordinator that is (re)starting
  pb::ShardSyncResponse response;
  ATL_RETURN_IF_ERROR(call.Status(control_->coordinator->ShardSync(&call.context, request, &response)));
  return response;
}

absl::StatusOr<pb::GetStateResponse> GrpcTransport::GetState(const pb::GetStateRequest& request) {
  Call call(*this, options_.rpc_timeout_s);
  pb::GetStateResponse response;
  ATL_RETURN_IF_ERROR(call.Status(control_->coordinator->GetState(&call.context, request, &response)));
  return response;
}

absl::StatusOr<pb::PushResponse> GrpcTransport::Push(const outer::PushSource& source, int lane) {
  Call call(*this, options_.rpc_timeout_s);
  pb::PushResponse response;
  auto writer = Lane(lane).outer_sync->Push(&call.context, &response);
  pb::PushRequest r;
  while (true) {
    r.Clear();
    auto more = source(&r);
    if (!more.ok()) {
      call.context.TryCancel();  // the service discards what it received
      writer->Finish().ok();
      return more.status();
    }
    if (!*more || !writer->Write(r)) break;  // a failed write: the server ended the call
  }
  writer->WritesDone();
  ATL_RETURN_IF_ERROR(call.Status(writer->Finish()));
  return response;
}

absl::Status GrpcTransport::AwaitUpdate(const pb::UpdateRequest& request,
                                        const outer::ChunkSink<pb::UpdateChunk>& sink, int lane) {
  Call call(*this, options_.rpc_timeout_s + options_.round_timeout_s);
  auto reader = Lane(lane).outer_sync->AwaitUpdate(&call.context, request);
  return call.ReadInto<pb::UpdateChunk>(reader, sink);
}

absl::Status GrpcTransport::FetchState(const pb::FetchStateRequest& request,
                                       const outer::ChunkSink<pb::StateChunk>& sink, int lane) {
  Call call(*this, options_.rpc_timeout_s);
  auto reader = Lane(lane).outer_sync->FetchState(&call.context, request);
  return call.ReadInto<pb::StateChunk>(reader, sink);
}

absl::StatusOr<std::unique_ptr<outer::Transport>> ConnectIsland(const std::string& target,
                                                                const std::string& token,
                                                                const TlsFiles& tls,
                                                                const outer::OuterConfig& outer) {
  GrpcTransportOptions t;
  t.target = target;
  t.token = token;
  t.tls = tls;
  t.rpc_timeout_s = outer.rpc_timeout_s;
  t.round_timeout_s = outer.round_timeout_s;
  t.connections = outer.connections;
  ATL_ASSIGN_OR_RETURN(auto coordinator, GrpcTransport::Create(t));
  return std::unique_ptr<outer::Transport>(std::make_unique<outer::ShardRouter>(
      std::move(coordinator),
      [t](const std::string& address) -> absl::StatusOr<std::unique_ptr<outer::Transport>> {
        GrpcTransportOptions to_shard = t;
        to_shard.target = address;
        ATL_ASSIGN_OR_RETURN(auto opened, GrpcTransport::Create(to_shard));
        return std::unique_ptr<outer::Transport>(std::move(opened));
      }));
}

}  // namespace atl
