// The coordinator's gRPC server: the Coordinator and OuterSync services over one SyncServer.
//
// What a peer must get past, in order, on every call: the run token; with mutual TLS, a client
// certificate whose common name is the island the call names; the island's session credential
// (checked by the SyncServer); and the limits below. Nothing reaches the SyncServer's state before
// that, and no peer can make the server hold unbounded memory or threads:
//   - messages are at most kMaxMessageBytes (chunks are 1 MiB by default, 4 MiB at most);
//   - a push is checked message by message before anything is kept (PushStream);
//   - calls are counted in budgets of their own, so that no kind of caller takes another's
//     places; over its budget a call is refused with RESOURCE_EXHAUSTED (islands retry), and the
//     gRPC thread pool is capped to match:
//       a member island: max_calls_per_island calls at a time;
//       joins: max_pending_calls, plus one place per data stream kept for islands coming back (a
//         member's or former member's name), which a flood of joins under new names cannot take;
//       state queries (GetState): max_pending_calls, and a quarter of that from any one peer
//         address;
//       other calls not tied to a member (pushes before their first message, refused calls):
//         max_pending_calls together, and a quarter of that from any one peer address;
//       a sharded service's shard servers: two long polls per shard;
//   - a push stream is cancelled when its first message has not arrived within
//     stream_first_message_s, or when it then sends nothing for stream_idle_timeout_s;
//   - HTTP/2: a bounded number of concurrent streams per connection, keepalive pings from clients
//     no more often than every 10 s, idle connections closed after 10 minutes;
//   - the listening port is never shared (SO_REUSEPORT off): a second coordinator on the same
//     port fails to start instead of splitting the islands between two services.
#ifndef ATOLL_SRC_NET_GRPC_SERVER_H_
#define ATOLL_SRC_NET_GRPC_SERVER_H_

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "outer/service/sync_server.h"
#include "src/net/rpc_security.h"

namespace atl {

inline constexpr int kMaxMessageBytes = (4 << 20) + (64 << 10);

// Bytes the server moved for each island: pushes received, updates and state fetches sent
// (serialized message sizes). Thread-safe.
class TrafficCounters {
 public:
  struct Bytes {
    uint64_t received = 0;
    uint64_t sent = 0;
  };
  // At most kMaxIslands names are counted apart; the rest count under "(other)".
  static constexpr size_t kMaxIslands = 4096;
  void Add(const std::string& island, uint64_t received, uint64_t sent);
  std::map<std::string, Bytes> Snapshot() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, Bytes> bytes_;
};

struct GrpcServerOptions {
  std::string listen = "127.0.0.1:0";  // host:port; port 0 picks a free port
  std::string token;
  std::string shard_token;  // a sharded service's coordinator: what shard servers present
  TlsFiles tls;         // tls.ca set: mutual TLS, the certificate's common name is the island
  double tick_s = 0.1;  // how often round deadlines, leases and idle streams are checked
  double stream_idle_timeout_s = 60;
  double stream_first_message_s = 10;
  int max_pending_calls = 64;
  int max_calls_per_island = 32;
  TrafficCounters* traffic = nullptr;  // counts per island when set
};

class GrpcServer {
 public:
  // Errors name the problem: an address that is not HOST:PORT, a port in use, unreadable or
  // mismatched TLS files.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(outer::SyncServer* sync,
                                                           const GrpcServerOptions& options);
  ~GrpcServer();

  // "host:port" actually bound.
  const std::string& address() const { return address_; }
  void Shutdown();

 private:
  GrpcServer() = default;
  class Guard;
  class CoordinatorImpl;
  class OuterSyncImpl;
  std::unique_ptr<Guard> guard_;
  std::unique_ptr<CoordinatorImpl> coordinator_;
  std::unique_ptr<OuterSyncImpl> outer_sync_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::atomic<bool> stopping_{false};
  std::thread ticker_;
};

}  // namespace atl

#endif  // ATOLL_SRC_NET_GRPC_SERVER_H_
