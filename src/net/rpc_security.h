// Run token and TLS for the outer-sync RPCs. The token travels as gRPC metadata
// ("authorization: Bearer <token>") on every call; it is read from a file or the ATOLL_TOKEN
// environment variable, never from the command line (which other users can read in ps).
#ifndef ATOLL_SRC_NET_RPC_SECURITY_H_
#define ATOLL_SRC_NET_RPC_SECURITY_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace atl {

inline constexpr char kTokenEnv[] = "ATOLL_TOKEN";
// A sharded service: the secret shard servers present to the coordinator (ShardSync), which the
// islands do not hold (the run token alone must not let an island pose as a shard).
inline constexpr char kShardTokenEnv[] = "ATOLL_SHARD_TOKEN";
inline constexpr char kAuthMetadata[] = "authorization";

// The token from `token_file` if given, else from $`env`; an error when neither has one.
absl::StatusOr<std::string> LoadToken(const std::string& token_file, const char* env = kTokenEnv);

// The same three files serve both ends:
//   coordinator: cert + key are its identity; ca, when given, turns on mutual TLS: every island
//     must present a certificate signed by it, whose common name is the island's name.
//   island: ca is the root to trust (and turns TLS on); cert + key, when given, are its own
//     certificate for mutual TLS.
// Every file is read and checked when credentials are made (parses as PEM, the key matches the
// certificate), so a swapped or unreadable file is a clear error before anything listens.
struct TlsFiles {
  std::string cert;  // certificate chain (PEM)
  std::string key;   // private key (PEM)
  std::string ca;    // root certificates (PEM)
};

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsFiles& tls);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const TlsFiles& tls);

// A gRPC status as an absl::Status of the same code; `what`, when given, prefixes the message.
absl::Status FromGrpc(const grpc::Status& s, const std::string& what = "");

// Checks a "host:port" listening address (IPv6 hosts in brackets, port 0-65535).
absl::Status CheckListenAddress(const std::string& address);
// Why binding `address` fails, asked of the operating system (after gRPC could not listen):
// "address already in use", "cannot assign requested address", ...; OK if it can bind now.
absl::Status ProbeListen(const std::string& address);

// Host and port of "HOST:PORT" / "[v6]:PORT"; INVALID_ARGUMENT naming the address otherwise.
absl::StatusOr<std::pair<std::string, int>> SplitAddress(const std::string& address);

}  // namespace atl

#endif  // ATOLL_SRC_NET_RPC_SECURITY_H_
