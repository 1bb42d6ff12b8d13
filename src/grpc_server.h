// The coordinator's gRPC server: the Coordinator and OuterSync services over one SyncServer, with
// the run token checked on every call. Payload streams are assembled here and handed to the
// SyncServer whole; nothing reaches it before the token is verified.
#ifndef ATOLL_SRC_GRPC_SERVER_H_
#define ATOLL_SRC_GRPC_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "outer/sync_server.h"
#include "src/rpc_security.h"

namespace atl {

struct GrpcServerOptions {
  std::string listen = "127.0.0.1:0";  // host:port; port 0 picks a free port
  std::string token;
  TlsFiles tls;
  double tick_s = 0.1;  // how often round deadlines are checked
};

class GrpcServer {
 public:
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(outer::SyncServer* sync,
                                                           const GrpcServerOptions& options);
  ~GrpcServer();

  // "host:port" actually bound.
  const std::string& address() const { return address_; }
  void Shutdown();

 private:
  GrpcServer() = default;
  class CoordinatorImpl;
  class OuterSyncImpl;
  std::unique_ptr<CoordinatorImpl> coordinator_;
  std::unique_ptr<OuterSyncImpl> outer_sync_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::atomic<bool> stopping_{false};
  std::thread ticker_;
};

}  // namespace atl

#endif  // ATOLL_SRC_GRPC_SERVER_H_
