// A small HTTP server for what operators look at: the Prometheus metrics endpoint, the status page
// and its JSON, health probes. GET only, exact paths; everything else answers 404 / 405.
#ifndef ATOLL_SRC_NET_HTTP_SERVER_H_
#define ATOLL_SRC_NET_HTTP_SERVER_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace atl {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};
// Called on the server's threads: must be thread-safe.
using HttpHandler = std::function<HttpResponse()>;

// Who may read: with a token, every path but `open` (health probes) requires it, as
// "Authorization: Bearer TOKEN" or "?token=TOKEN" (what a browser opening the status page can
// give); others get 401. Without one, everything is open.
struct HttpAccess {
  std::string token;
  std::set<std::string> open;
};

class HttpServer {
 public:
  // Listens on "HOST:PORT" (port 0: any free port) and serves `routes` until destroyed.
  // INVALID_ARGUMENT for a malformed address, UNAVAILABLE when it cannot be bound (saying why).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           std::map<std::string, HttpHandler> routes,
                                                           HttpAccess access = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The address bound, with the port chosen when 0 was asked for.
  const std::string& address() const { return address_; }

 private:
  HttpServer();
  std::unique_ptr<httplib::Server> server_;
  std::string address_;
  std::thread thread_;
};

// "HOST:PORT" with the port moved by `offset` (port 0 stays 0): the address of the i-th of several
// servers started from one flag (atoll local's islands, an island's ranks).
absl::StatusOr<std::string> OffsetAddress(const std::string& address, int offset);

}  // namespace atl

#endif  // ATOLL_SRC_NET_HTTP_SERVER_H_
