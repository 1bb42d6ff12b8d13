// Run token and TLS for the outer-sync RPCs. The token travels as gRPC metadata
// ("authorization: Bearer <token>") on every call; it is read from a file or the ATOLL_TOKEN
// environment variable, never from the command line (which other users can read in ps).
#ifndef ATOLL_SRC_RPC_SECURITY_H_
#define ATOLL_SRC_RPC_SECURITY_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace atl {

inline constexpr char kTokenEnv[] = "ATOLL_TOKEN";
inline constexpr char kAuthMetadata[] = "authorization";

// The token from `token_file` if given, else from $ATOLL_TOKEN; an error when neither has one.
absl::StatusOr<std::string> LoadToken(const std::string& token_file);

struct TlsFiles {
  std::string cert;  // server: certificate chain (PEM)
  std::string key;   // server: private key (PEM)
  std::string ca;    // client: root certificates to trust (PEM)
};

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsFiles& tls);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const TlsFiles& tls);

}  // namespace atl

#endif  // ATOLL_SRC_RPC_SECURITY_H_
