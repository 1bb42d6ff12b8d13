#include "src/net/http_server.h"

#include <httplib.h>

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "outer/service/credentials.h"
#include "outer/base/names.h"
#include "src/net/rpc_security.h"

namespace atl {

HttpServer::HttpServer() : server_(std::make_unique<httplib::Server>()) {}

HttpServer::~HttpServer() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

namespace {

bool Allowed(const HttpAccess& access, const std::string& path, const httplib::Request& req) {
  if (access.token.empty() || access.open.count(path) > 0) return true;
  const std::string auth = req.get_header_value("Authorization");
  if (absl::StartsWith(auth, "Bearer ") && outer::CredentialMatches(access.token, auth.substr(7))) {
    return true;
  }
  return req.has_param("token") && outer::CredentialMatches(access.token, req.get_param_value("token"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& address, std::map<std::string, HttpHandler> routes, HttpAccess access) {
  ATL_ASSIGN_OR_RETURN(auto split, SplitAddress(address));
  const auto& [host, port] = split;
  std::unique_ptr<HttpServer> self(new HttpServer());
  httplib::Server& server = *self->server_;
  // Requests are GETs: nothing of a body is kept, slow clients are dropped.
  server.set_payload_max_length(64 << 10);
  server.set_read_timeout(5, 0);
  server.set_write_timeout(5, 0);
  server.set_keep_alive_max_count(16);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second server on the same
  // port would silently share it instead of failing.
  server.set_socket_options([](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  for (auto& [path, handler] : routes) {
    server.Get(path, [handler = std::move(handler), path = path, access](
                         const httplib::Request& req, httplib::Response& res) {
      if (!Allowed(access, path, req)) {
        res.status = 401;
        res.set_header("WWW-Authenticate", "Bearer");
        res.set_content("missing or wrong token (the server's --http-token-file)\n",
                        "text/plain; charset=utf-8");
        return;
      }
      HttpResponse r = handler();
      res.status = r.status;
      res.set_content(std::move(r.body), r.content_type.c_str());
    });
  }
  int bound = port;
  if (port == 0) {
    bound = server.bind_to_any_port(host);
  } else if (!server.bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound <= 0) {
    auto why = ProbeListen(address);
    return why.ok() ? absl::UnavailableError(
                          absl::StrCat("cannot listen on ", outer::Printable(address), " (HTTP)"))
                    : why;
  }
  const std::string shown = host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host;
  self->address_ = absl::StrCat(shown, ":", bound);
  self->thread_ = std::thread([&server] { server.listen_after_bind(); });
  // httplib's stop() does nothing to a server not yet running, whose thread would then serve
  // forever: return only once it runs (at once, in practice).
  for (int i = 0; i < 5000 && !server.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return self;
}

absl::StatusOr<std::string> OffsetAddress(const std::string& address, int offset) {
  ATL_ASSIGN_OR_RETURN(auto split, SplitAddress(address));
  const auto& [host, port] = split;
  if (port == 0 || offset == 0) return address;
  if (port + offset > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address ", outer::Printable(address), " + ",
                                                   offset, ": the port passes 65535"));
  }
  const std::string shown = host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host;
  return absl::StrCat(shown, ":", port + offset);
}

}  // namespace atl
