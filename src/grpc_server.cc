#include "src/grpc_server.h"

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "atoll/v1/outer.grpc.pb.h"
#include "outer/credentials.h"
#include "outer/names.h"
#include "outer/in_process_transport.h"

namespace atl {
namespace {

namespace pb = ::atollpb::v1;

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode(int(s.code())), std::string(s.message()));
}

grpc::Status CheckToken(grpc::ServerContext* context, const std::string& token) {
  const auto& md = context->client_metadata();
  auto it = md.find(kAuthMetadata);
  if (it != md.end()) {
    const std::string value(it->second.data(), it->second.size());
    if (absl::StartsWith(value, "Bearer ") && outer::CredentialMatches(token, value.substr(7))) {
      return grpc::Status::OK;
    }
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong run token");
}

}  // namespace

class GrpcServer::CoordinatorImpl final : public pb::Coordinator::Service {
 public:
  CoordinatorImpl(outer::SyncServer* sync, std::string token) : sync_(sync), token_(std::move(token)) {}

  grpc::Status Join(grpc::ServerContext* ctx, const pb::JoinRequest* req,
                    pb::JoinResponse* resp) override {
    if (auto s = CheckToken(ctx, token_); !s.ok()) return s;
    auto r = sync_->Join(*req);
    if (!r.ok()) return ToGrpc(r.status());
    *resp = *std::move(r);
    return grpc::Status::OK;
  }
  grpc::Status Leave(grpc::ServerContext* ctx, const pb::LeaveRequest* req,
                     pb::LeaveResponse*) override {
    if (auto s = CheckToken(ctx, token_); !s.ok()) return s;
    return ToGrpc(sync_->Leave(*req));
  }
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const pb::HeartbeatRequest* req,
                         pb::HeartbeatResponse* resp) override {
    if (auto s = CheckToken(ctx, token_); !s.ok()) return s;
    auto r = sync_->Heartbeat(*req);
    if (!r.ok()) return ToGrpc(r.status());
    *resp = *std::move(r);
    return grpc::Status::OK;
  }
  grpc::Status GetState(grpc::ServerContext* ctx, const pb::GetStateRequest* req,
                        pb::GetStateResponse* resp) override {
    if (auto s = CheckToken(ctx, token_); !s.ok()) return s;
    if (req->run_id() != sync_->options().run_id) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "unknown run " + outer::Printable(req->run_id()));
    }
    *resp = sync_->GetState();
    return grpc::Status::OK;
  }

 private:
  outer::SyncServer* sync_;
  std::string token_;
};

class GrpcServer::OuterSyncImpl final : public pb::OuterSync::Service {
 public:
  OuterSyncImpl(outer::SyncServer* sync, std::string token) : sync_(sync), token_(std::move(token)) {}

  grpc::Status Push(grpc::ServerContext* ctx, grpc::ServerReader<pb::PushRequest>* reader,
                    pb::PushResponse* resp) override {
    if (auto s = CheckToken(ctx, token_); !s.ok()) return s;
    // Every message is checked as it arrives, before it is kept (PushStream::Add): a peer cannot
    // make the service hold more than the encoded size of one fragment per push.
    pb::PushRequest r;
    if (!reader->Read(&r)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty push: no chunks");
    }
    auto stream = sync_->OpenPush(r);
    if (!stream.ok()) return ToGrpc(stream.status());
    do {
      if (auto s = (*stream)->Add(std::move(r)); !s.ok()) return ToGrpc(s);
    } while (reader->Read(&r));
    auto result = sync_->FinishPush(*std::move(stream));
    if (!result.ok()) return ToGrpc(result.status());
    *resp = *std::move(result);
    return grpc::Status::OK;
  }

  grpc::Status AwaitUpdate(grpc::ServerContext* ctx, const pb::UpdateRequest* req,
                           grpc::ServerWriter<pb::UpdateChunk>* writer) override {
    if (auto s = CheckToken(ctx, token_); !s.ok()) return s;
    const auto deadline = std::min(absl::FromChrono(ctx->deadline()),
                                   absl::Now() + absl::Seconds(sync_->options().round_timeout_s * 2));
    auto chunks = outer::UpdateChunksFor(*sync_, *req, deadline);
    if (!chunks.ok()) return ToGrpc(chunks.status());
    for (const auto& c : *chunks) {
      if (!writer->Write(c)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
    return grpc::Status::OK;
  }

  grpc::Status FetchState(grpc::ServerContext* ctx, const pb::FetchStateRequest* req,
                          grpc::ServerWriter<pb::StateChunk>* writer) override {
    if (auto s = CheckToken(ctx, token_); !s.ok()) return s;
    auto chunks = sync_->FetchState(*req);
    if (!chunks.ok()) return ToGrpc(chunks.status());
    for (const auto& c : *chunks) {
      if (!writer->Write(c)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
    return grpc::Status::OK;
  }

 private:
  outer::SyncServer* sync_;
  std::string token_;
};

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(outer::SyncServer* sync,
                                                              const GrpcServerOptions& options) {
  if (options.token.empty()) return absl::InvalidArgumentError("the server needs a run token");
  auto creds = ServerCredentials(options.tls);
  if (!creds.ok()) return creds.status();
  std::unique_ptr<GrpcServer> server(new GrpcServer());
  server->coordinator_ = std::make_unique<CoordinatorImpl>(sync, options.token);
  server->outer_sync_ = std::make_unique<OuterSyncImpl>(sync, options.token);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, *creds, &port);
  builder.RegisterService(server->coordinator_.get());
  builder.RegisterService(server->outer_sync_.get());
  builder.SetMaxReceiveMessageSize(16 << 20);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  const auto colon = options.listen.rfind(':');
  server->address_ = absl::StrCat(options.listen.substr(0, colon), ":", port);
  GrpcServer* self = server.get();
  server->ticker_ = std::thread([self, sync, tick = options.tick_s] {
    while (!self->stopping_.load()) {
      std::this_thread::sleep_for(std::chrono::duration<double>(tick));
      sync->Tick(absl::Now());
    }
  });
  return server;
}

void GrpcServer::Shutdown() {
  if (stopping_.exchange(true)) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (ticker_.joinable()) ticker_.join();
}

GrpcServer::~GrpcServer() { Shutdown(); }

}  // namespace atl
