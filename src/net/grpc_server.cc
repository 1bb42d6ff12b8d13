#include "src/net/grpc_server.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/resource_quota.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "atoll/v1/outer.grpc.pb.h"
#include "outer/service/credentials.h"
#include "outer/service/in_process_transport.h"
#include "outer/base/names.h"

namespace atl {
namespace {

namespace pb = ::atollpb::v1;

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode(int(s.code())), std::string(s.message()));
}

// Counts running calls in budgets of their own, so that no kind of caller takes another's places
// (GrpcServer's header lists them). A call takes a place under one or more keys at once (an
// anonymous call: the anonymous budget and its peer address's share), or is refused; its Slot
// holds the places until it is destroyed or moved on (a push, once its first message names a
// member, moves to that island's budget).
class CallLimits {
 public:
  struct Place {
    std::string key;      // what is counted
    int max;              // at most this many at once
    std::string refusal;  // the RESOURCE_EXHAUSTED message when full
  };

  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& o) noexcept : limits_(std::exchange(o.limits_, nullptr)), keys_(std::move(o.keys_)) {}
    Slot& operator=(Slot&& o) noexcept {
      Release();
      limits_ = std::exchange(o.limits_, nullptr);
      keys_ = std::move(o.keys_);
      return *this;
    }
    ~Slot() { Release(); }

   private:
    friend class CallLimits;
    void Release() {
      if (limits_ != nullptr) limits_->Leave(keys_);
      limits_ = nullptr;
    }
    CallLimits* limits_ = nullptr;
    std::vector<std::string> keys_;
  };

  // A place under every key of `places`, or none (RESOURCE_EXHAUSTED naming the full budget).
  absl::Status Enter(const std::vector<Place>& places, Slot* slot) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Place& p : places) {
      auto it = counts_.find(p.key);
      if (it != counts_.end() && it->second >= p.max) {
        return absl::ResourceExhaustedError(p.refusal);
      }
    }
    std::vector<std::string> keys;
    for (const Place& p : places) {
      ++counts_[p.key];
      keys.push_back(p.key);
    }
    *slot = Slot();
    slot->limits_ = this;
    slot->keys_ = std::move(keys);
    return absl::OkStatus();
  }

 private:
  void Leave(const std::vector<std::string>& keys) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& key : keys) {
      auto it = counts_.find(key);
      if (--it->second == 0) counts_.erase(it);
    }
  }

  std::mutex mu_;
  std::map<std::string, int> counts_;  // keys with calls running only: bounded by the calls
};

// Push streams in progress, with the time each last delivered a message; the ticker cancels
// those silent for longer than the timeout (a stream that sends nothing holds a thread).
class IdleStreams {
 public:
  class Watch {
   public:
    Watch(IdleStreams* owner, grpc::ServerContext* ctx) : owner_(owner), ctx_(ctx) { Touch(); }
    ~Watch() { owner_->Remove(this); }
    void Touch() {
      last_ns_ = std::chrono::steady_clock::now().time_since_epoch().count();
    }
    // The stream's first message has arrived: from now on the idle timeout applies.
    void Started() {
      started_ = true;
      Touch();
    }

   private:
    friend class IdleStreams;
    IdleStreams* owner_;
    grpc::ServerContext* ctx_;
    std::atomic<int64_t> last_ns_{0};
    std::atomic<bool> started_{false};
  };

  std::unique_ptr<Watch> Register(grpc::ServerContext* ctx) {
    auto w = std::make_unique<Watch>(this, ctx);
    std::lock_guard<std::mutex> lock(mu_);
    watches_.insert(w.get());
    return w;
  }

  // Cancels streams silent for longer than `idle_s`, or than `first_s` before their first message.
  void CancelIdle(double idle_s, double first_s) {
    const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    std::lock_guard<std::mutex> lock(mu_);
    for (Watch* w : watches_) {
      const double limit_s = w->started_.load() ? idle_s : first_s;
      if (now - w->last_ns_.load() > int64_t(limit_s * 1e9)) w->ctx_->TryCancel();
    }
  }

 private:
  void Remove(Watch* w) {
    std::lock_guard<std::mutex> lock(mu_);
    watches_.erase(w);
  }
  std::mutex mu_;
  std::set<Watch*> watches_;
};

}  // namespace

void TrafficCounters::Add(const std::string& island, uint64_t received, uint64_t sent) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = bytes_.find(island);
  if (it == bytes_.end()) {
    it = bytes_.size() < kMaxIslands ? bytes_.emplace(island, Bytes{}).first
                                     : bytes_.emplace("(other)", Bytes{}).first;
  }
  it->second.received += received;
  it->second.sent += sent;
}

std::map<std::string, TrafficCounters::Bytes> TrafficCounters::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

namespace {

// The budgets of calls a server admits at once (see the header).
struct CallBudgets {
  int anonymous, per_address, joins, rejoins, shards, per_island;
  double idle_s, first_message_s;
};

CallBudgets BudgetsOf(const GrpcServerOptions& o, const outer::SyncServerOptions& service) {
  CallBudgets b;
  b.anonymous = o.max_pending_calls;
  b.per_address = std::max(1, o.max_pending_calls / 4);
  b.joins = o.max_pending_calls;
  b.rejoins = int(std::max<uint32_t>(1, service.num_data_streams));
  b.shards = 2 * int(std::max<uint32_t>(1, service.num_shards));
  b.per_island = o.max_calls_per_island;
  b.idle_s = o.stream_idle_timeout_s;
  b.first_message_s = std::min(o.stream_first_message_s, o.stream_idle_timeout_s);
  return b;
}

// "ipv4:10.0.0.7:51234" -> "ipv4:10.0.0.7": a peer's address without its port.
std::string PeerAddress(const grpc::ServerContext* ctx) {
  const std::string peer = ctx->peer();
  const auto colon = peer.rfind(':');
  return colon == std::string::npos || colon < 5 ? peer : peer.substr(0, colon);
}

}  // namespace

// Everything a call must get past before it reaches the SyncServer.
class GrpcServer::Guard {
 public:
  Guard(outer::SyncServer* sync, const GrpcServerOptions& options)
      : sync_(sync),
        token_(options.token),
        shard_token_(options.shard_token),
        mutual_tls_(!options.tls.ca.empty()),
        budgets_(BudgetsOf(options, sync->options())),
        traffic_(options.traffic) {}

  // Handler threads to cap gRPC's pool at: every budget full, plus room for calls refused at the
  // door.
  int MaxThreads() const {
    const CallBudgets& b = budgets_;
    // (State queries have as many places as the calls not tied to a member.)
    return 2 * b.anonymous + b.joins + b.rejoins + b.shards +
           int(sync_->options().num_data_streams) * b.per_island + 32;
  }

  void Count(const std::string& island, uint64_t received, uint64_t sent) {
    if (traffic_ != nullptr) traffic_->Add(island, received, sent);
  }

  // The run token (a shard server's call: the shard token).
  grpc::Status Admit(grpc::ServerContext* ctx, bool shard = false) {
    const auto& md = ctx->client_metadata();
    auto it = md.find(kAuthMetadata);
    bool ok = false;
    if (it != md.end()) {
      const std::string value(it->second.data(), it->second.size());
      ok = absl::StartsWith(value, "Bearer ") &&
           outer::CredentialMatches(shard ? shard_token_ : token_, value.substr(7));
    }
    if (!ok) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          shard ? "missing or wrong shard token" : "missing or wrong run token");
    }
    return grpc::Status::OK;
  }

  // A place among the calls not tied to a member, within its peer address's share.
  grpc::Status Pending(grpc::ServerContext* ctx, CallLimits::Slot* slot) {
    return Shared(ctx, "anonymous", "calls not tied to a member", slot);
  }

  // A place among the state queries (GetState): unary and answered from memory, so they have
  // places of their own (as many as the calls above) that streams waiting for their first message
  // cannot hold.
  grpc::Status Querying(grpc::ServerContext* ctx, CallLimits::Slot* slot) {
    return Shared(ctx, "query", "state queries", slot);
  }

  // A place under `key` among budgets_.anonymous, within the peer address's share of them.
  grpc::Status Shared(grpc::ServerContext* ctx, const std::string& key, const char* what,
                      CallLimits::Slot* slot) {
    const std::string address = PeerAddress(ctx);
    return ToGrpc(limits_.Enter(
        {{key, budgets_.anonymous,
          absl::StrCat("the service is handling its maximum of ", budgets_.anonymous, " ", what,
                       "; retry later")},
         {key + " " + address, budgets_.per_address,
          absl::StrCat("the service is handling its maximum of ", budgets_.per_address, " ", what,
                       " from ", outer::Printable(address), "; retry later")}},
        slot));
  }

  // A place among the joins; an island coming back (a member's or former member's name) may take
  // one of the places kept for rejoins when the joins are full.
  grpc::Status Joining(const std::string& name, CallLimits::Slot* slot) {
    const absl::Status s = limits_.Enter(
        {{"join", budgets_.joins,
          absl::StrCat("the service is handling its maximum of ", budgets_.joins,
                       " joins; retry later")}},
        slot);
    if (s.ok() || !sync_->KnowsIsland(name)) return ToGrpc(s);
    return ToGrpc(limits_.Enter(
        {{"rejoin", budgets_.rejoins,
          absl::StrCat("the service is handling its maximum of ", budgets_.rejoins,
                       " rejoins; retry later")}},
        slot));
  }

  // A shard server's long poll.
  grpc::Status ShardPoll(CallLimits::Slot* slot) {
    return ToGrpc(limits_.Enter(
        {{"shard", budgets_.shards,
          absl::StrCat("the service is handling its maximum of ", budgets_.shards,
                       " shard polls; retry later")}},
        slot));
  }

  // With mutual TLS, the certificate must be the named island's.
  grpc::Status CheckPeer(grpc::ServerContext* ctx, const std::string& island) const {
    if (!mutual_tls_) return grpc::Status::OK;
    const auto names = ctx->auth_context()->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
    if (names.empty()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no client certificate name");
    }
    const std::string cn(names.front().data(), names.front().size());
    if (cn != island) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("the client certificate is island ", outer::Printable(cn),
                                       "'s; the call names island ", outer::Printable(island)));
    }
    return grpc::Status::OK;
  }

  // The certificate, then a place among the island's calls for a member presenting its session,
  // or among the pending calls for anything else (which the SyncServer then refuses at once, with
  // the status that tells an island what to do).
  grpc::Status Identify(grpc::ServerContext* ctx, const std::string& island,
                        const std::string& session, CallLimits::Slot* slot) {
    if (auto s = CheckPeer(ctx, island); !s.ok()) return s;
    if (!sync_->Authenticate(island, session).ok()) return Pending(ctx, slot);
    return ToGrpc(limits_.Enter(
        {{"island " + island, budgets_.per_island,
          absl::StrCat("island '", island, "' already has ", budgets_.per_island,
                       " calls running; retry later")}},
        slot));
  }

  std::unique_ptr<IdleStreams::Watch> Watch(grpc::ServerContext* ctx) {
    return idle_.Register(ctx);
  }
  void CancelIdleStreams() { idle_.CancelIdle(budgets_.idle_s, budgets_.first_message_s); }
  double idle_timeout_s() const { return budgets_.idle_s; }
  double first_message_timeout_s() const { return budgets_.first_message_s; }

 private:
  outer::SyncServer* sync_;
  const std::string token_, shard_token_;
  const bool mutual_tls_;
  const CallBudgets budgets_;
  CallLimits limits_;
  TrafficCounters* traffic_;
  IdleStreams idle_;
};

class GrpcServer::CoordinatorImpl final : public pb::Coordinator::Service {
 public:
  CoordinatorImpl(outer::SyncServer* sync, Guard* guard) : sync_(sync), guard_(guard) {}

  grpc::Status Join(grpc::ServerContext* ctx, const pb::JoinRequest* req,
                    pb::JoinResponse* resp) override {
    CallLimits::Slot call;
    if (auto s = guard_->Admit(ctx); !s.ok()) return s;
    if (auto s = guard_->CheckPeer(ctx, req->name()); !s.ok()) return s;
    if (auto s = guard_->Joining(req->name(), &call); !s.ok()) return s;
    auto r = sync_->Join(*req);
    if (!r.ok()) return ToGrpc(r.status());
    *resp = *std::move(r);
    return grpc::Status::OK;
  }
  grpc::Status Leave(grpc::ServerContext* ctx, const pb::LeaveRequest* req,
                     pb::LeaveResponse*) override {
    CallLimits::Slot call;
    if (auto s = guard_->Admit(ctx); !s.ok()) return s;
    if (auto s = guard_->Identify(ctx, req->island_id(), req->session(), &call); !s.ok()) return s;
    return ToGrpc(sync_->Leave(*req));
  }
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const pb::HeartbeatRequest* req,
                         pb::HeartbeatResponse* resp) override {
    CallLimits::Slot call;
    if (auto s = guard_->Admit(ctx); !s.ok()) return s;
    if (auto s = guard_->Identify(ctx, req->island_id(), req->session(), &call); !s.ok()) return s;
    auto r = sync_->Heartbeat(*req);
    if (!r.ok()) return ToGrpc(r.status());
    *resp = *std::move(r);
    return grpc::Status::OK;
  }
  grpc::Status GetState(grpc::ServerContext* ctx, const pb::GetStateRequest* req,
                        pb::GetStateResponse* resp) override {
    CallLimits::Slot call;
    if (auto s = guard_->Admit(ctx); !s.ok()) return s;
    if (auto s = guard_->Querying(ctx, &call); !s.ok()) return s;
    if (req->run_id() != sync_->options().run_id) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "unknown run " + outer::Printable(req->run_id()));
    }
    *resp = sync_->GetState();
    return grpc::Status::OK;
  }
  // A shard server's long poll (its certificate, with mutual TLS, is "shard-K").
  grpc::Status ShardSync(grpc::ServerContext* ctx, const pb::ShardSyncRequest* req,
                         pb::ShardSyncResponse* resp) override {
    CallLimits::Slot call;
    if (auto s = guard_->Admit(ctx, /*shard=*/true); !s.ok()) return s;
    if (auto s = guard_->CheckPeer(ctx, absl::StrCat("shard-", req->shard())); !s.ok()) return s;
    if (auto s = guard_->ShardPoll(&call); !s.ok()) return s;
    // Never past the caller's deadline, nor past a second (a shutdown waits for it).
    const absl::Time deadline = std::min(absl::Now() + absl::Seconds(1),
                                         absl::FromChrono(ctx->deadline()) - absl::Milliseconds(50));
    auto r = sync_->ShardSync(*req, deadline);
    if (!r.ok()) return ToGrpc(r.status());
    *resp = *std::move(r);
    return grpc::Status::OK;
  }

 private:
  outer::SyncServer* sync_;
  Guard* guard_;
};

class GrpcServer::OuterSyncImpl final : public pb::OuterSync::Service {
 public:
  OuterSyncImpl(outer::SyncServer* sync, Guard* guard) : sync_(sync), guard_(guard) {}

  grpc::Status Push(grpc::ServerContext* ctx, grpc::ServerReader<pb::PushRequest>* reader,
                    pb::PushResponse* resp) override {
    CallLimits::Slot call;
    if (auto s = guard_->Admit(ctx); !s.ok()) return s;
    if (auto s = guard_->Pending(ctx, &call); !s.ok()) return s;
    auto watch = guard_->Watch(ctx);
    // Every message is checked as it arrives, before it is kept (PushStream::Add): a peer cannot
    // make the service hold more than the encoded size of one fragment per push.
    pb::PushRequest r;
    sync_->LendBuffer(&r);
    if (!reader->Read(&r)) return Ended(ctx, "empty push: no chunks", /*started=*/false);
    watch->Started();
    const auto& h = r.chunk().header();
    CallLimits::Slot island;
    if (auto s = guard_->Identify(ctx, h.island_id(), r.session(), &island); !s.ok()) return s;
    call = std::move(island);  // a member's push counts among its own calls from here on
    auto stream = sync_->OpenPush(r);
    if (!stream.ok()) return ToGrpc(stream.status());
    const std::string island_id = h.island_id();
    do {
      watch->Touch();
      guard_->Count(island_id, r.ByteSizeLong(), 0);
      if (auto s = (*stream)->Add(std::move(r)); !s.ok()) return ToGrpc(s);
      sync_->LendBuffer(&r);
    } while (reader->Read(&r));
    if (ctx->IsCancelled()) return Ended(ctx, "push cancelled", /*started=*/true);
    auto result = sync_->FinishPush(*std::move(stream));
    if (!result.ok()) return ToGrpc(result.status());
    *resp = *std::move(result);
    return grpc::Status::OK;
  }

  grpc::Status AwaitUpdate(grpc::ServerContext* ctx, const pb::UpdateRequest* req,
                           grpc::ServerWriter<pb::UpdateChunk>* writer) override {
    CallLimits::Slot call;
    if (auto s = guard_->Admit(ctx); !s.ok()) return s;
    if (auto s = guard_->Identify(ctx, req->island_id(), req->session(), &call); !s.ok()) return s;
    const auto deadline = std::min(absl::FromChrono(ctx->deadline()),
                                   absl::Now() + absl::Seconds(sync_->options().round_timeout_s * 2));
    return ToGrpc(outer::StreamUpdate(
        *sync_, *req, deadline, [ctx] { return ctx->IsCancelled(); },
        [this, writer, &req](pb::UpdateChunk&& c) {
          guard_->Count(req->island_id(), 0, c.ByteSizeLong());
          return writer->Write(c);
        }));
  }

  grpc::Status FetchState(grpc::ServerContext* ctx, const pb::FetchStateRequest* req,
                          grpc::ServerWriter<pb::StateChunk>* writer) override {
    CallLimits::Slot call;
    if (auto s = guard_->Admit(ctx); !s.ok()) return s;
    if (auto s = guard_->Identify(ctx, req->island_id(), req->session(), &call); !s.ok()) return s;
    return ToGrpc(sync_->FetchState(*req, [this, writer, &req](pb::StateChunk&& c) {
      guard_->Count(req->island_id(), 0, c.ByteSizeLong());
      return writer->Write(c);
    }));
  }

 private:
  // A stream that ended early: cancelled for idleness (the ticker), by the client, or empty.
  grpc::Status Ended(grpc::ServerContext* ctx, const char* otherwise, bool started) const {
    if (ctx->IsCancelled()) {
      return grpc::Status(
          grpc::StatusCode::CANCELLED,
          started ? absl::StrCat("push stream cancelled (idle for more than ",
                                 guard_->idle_timeout_s(), " s, or the client went away)")
                  : absl::StrCat("push stream cancelled (no first message within ",
                                 guard_->first_message_timeout_s(),
                                 " s, or the client went away)"));
    }
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, otherwise);
  }

  outer::SyncServer* sync_;
  Guard* guard_;
};

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(outer::SyncServer* sync,
                                                              const GrpcServerOptions& options) {
  if (options.token.empty()) return absl::InvalidArgumentError("the server needs a run token");
  if (auto s = CheckListenAddress(options.listen); !s.ok()) return s;
  if (options.max_pending_calls < 1 || options.max_calls_per_island < 1 ||
      !(options.stream_idle_timeout_s > 0) || !(options.stream_first_message_s > 0)) {
    return absl::InvalidArgumentError("server limits must be positive");
  }
  auto creds = ServerCredentials(options.tls);
  if (!creds.ok()) return creds.status();
  std::unique_ptr<GrpcServer> server(new GrpcServer());
  server->guard_ = std::make_unique<Guard>(sync, options);
  server->coordinator_ = std::make_unique<CoordinatorImpl>(sync, server->guard_.get());
  server->outer_sync_ = std::make_unique<OuterSyncImpl>(sync, server->guard_.get());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, *creds, &port);
  builder.RegisterService(server->coordinator_.get());
  builder.RegisterService(server->outer_sync_.get());
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 64);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 10 * 60 * 1000);
  grpc::ResourceQuota quota("atoll-coordinator");
  quota.SetMaxThreads(server->guard_->MaxThreads());
  builder.SetResourceQuota(quota);
  // Threads waiting for new calls: a heartbeat that arrives while every poller is busy with a
  // push's messages would otherwise wait for one to be made.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 4);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    server->server_.reset();
    auto why = ProbeListen(options.listen);
    return why.ok() ? absl::UnavailableError(absl::StrCat("cannot listen on ",
                                                           outer::Printable(options.listen)))
                    : why;
  }
  const auto colon = options.listen.rfind(':');
  server->address_ = absl::StrCat(options.listen.substr(0, colon), ":", port);
  GrpcServer* self = server.get();
  server->ticker_ = std::thread([self, sync, tick = options.tick_s] {
    while (!self->stopping_.load()) {
      std::this_thread::sleep_for(std::chrono::duration<double>(tick));
      sync->Tick(absl::Now());
      self->guard_->CancelIdleStreams();
    }
  });
  return server;
}

void GrpcServer::Shutdown() {
  if (stopping_.exchange(true)) return;
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  if (ticker_.joinable()) ticker_.join();
}

GrpcServer::~GrpcServer() { Shutdown(); }

}  // namespace atl
