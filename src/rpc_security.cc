#include "src/rpc_security.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"

namespace atl {
namespace {

absl::StatusOr<std::string> ReadAll(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<std::string> LoadToken(const std::string& token_file) {
  std::string token;
  if (!token_file.empty()) {
    auto text = ReadAll(token_file, "token file");
    if (!text.ok()) return text.status();
    token = std::string(absl::StripAsciiWhitespace(*text));
    if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", token_file, " is empty"));
    return token;
  }
  if (const char* env = std::getenv(kTokenEnv); env != nullptr && *env != '\0') return std::string(env);
  return absl::InvalidArgumentError(absl::StrCat(
      "a run token is required: pass --token-file FILE or set ", kTokenEnv));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsFiles& tls) {
  if (tls.cert.empty() && tls.key.empty()) return grpc::InsecureServerCredentials();
  if (tls.cert.empty() || tls.key.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  auto cert = ReadAll(tls.cert, "TLS certificate");
  if (!cert.ok()) return cert.status();
  auto key = ReadAll(tls.key, "TLS key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const TlsFiles& tls) {
  if (tls.ca.empty()) return grpc::InsecureChannelCredentials();
  auto ca = ReadAll(tls.ca, "TLS CA file");
  if (!ca.ok()) return ca.status();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = *ca;
  return grpc::SslCredentials(options);
}

}  // namespace atl
