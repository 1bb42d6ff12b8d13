#include "src/net/rpc_security.h"

#include <netdb.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "compression/status_macros.h"
#include "outer/base/names.h"

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

absl::StatusOr<std::string> LoadToken(const std::string& token_file, const char* env_name) {
  std::string token;
  if (!token_file.empty()) {
    ATL_ASSIGN_OR_RETURN(auto text, ReadAll(token_file, "token file"));
    token = std::string(absl::StripAsciiWhitespace(text));
    if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", token_file, " is empty"));
    return token;
  }
  if (const char* env = std::getenv(env_name); env != nullptr && *env != '\0') return std::string(env);
  const bool shard = std::string(env_name) == kShardTokenEnv;
  return absl::InvalidArgumentError(absl::StrCat(
      shard ? "a sharded service needs a shard token: pass --shard-token-file FILE or set "
            : "a run token is required: pass --token-file FILE or set ",
      env_name));
}

namespace {

using BioPtr = std::unique_ptr<BIO, decltype(&BIO_free)>;

BioPtr MemoryBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), int(pem.size())), &BIO_free);
}

// Reads a PEM file holding at least one certificate; returns its text.
absl::StatusOr<std::string> ReadCertificates(const std::string& path, const char* flag) {
  ATL_ASSIGN_OR_RETURN(auto pem, ReadAll(path, flag));
  auto bio = MemoryBio(pem);
  X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " holds no PEM certificate",
                                                   pem.find("PRIVATE KEY") != std::string::npos
                                                       ? " (it holds a private key: swapped files?)"
                                                       : ""));
  }
  X509_free(cert);
  return pem;
}

// The certificate chain and the private key, checked to be a matching pair.
absl::Status CheckKeyPair(const std::string& cert_pem, const std::string& key_pem,
                          const TlsFiles& tls) {
  auto key_bio = MemoryBio(key_pem);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr);
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-key ", tls.key, " holds no unencrypted PEM private key",
        key_pem.find("CERTIFICATE") != std::string::npos ? " (it holds a certificate: swapped files?)"
                                                         : ""));
  }
  auto cert_bio = MemoryBio(cert_pem);
  X509* cert = PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr);
  const bool match = cert != nullptr && X509_check_private_key(cert, key) == 1;
  X509_free(cert);
  EVP_PKEY_free(key);
  if (!match) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-key ", tls.key,
                                                   " is not the key of the certificate in --tls-cert ",
                                                   tls.cert));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::string, std::string>> ReadKeyPair(const TlsFiles& tls) {
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  ATL_ASSIGN_OR_RETURN(auto cert, ReadCertificates(tls.cert, "--tls-cert"));
  ATL_ASSIGN_OR_RETURN(auto key, ReadAll(tls.key, "--tls-key"));
  ATL_RETURN_IF_ERROR(CheckKeyPair(cert, key, tls));
  return std::make_pair(std::move(cert), std::move(key));
}

}  // namespace

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(absl::StatusCode(int(s.error_code())),
                      what.empty() ? s.error_message() : absl::StrCat(what, ": ", s.error_message()));
}

absl::StatusOr<std::pair<std::string, int>> SplitAddress(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("listening address ", outer::Printable(address),
                                                   " must be HOST:PORT"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = -1;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("listening address ", outer::Printable(address),
                                                   ": the port must be a number from 0 to 65535"));
  }
  return std::make_pair(host, port);
}


absl::Status CheckListenAddress(const std::string& address) {
  return SplitAddress(address).status();
}

absl::Status ProbeListen(const std::string& address) {
  ATL_ASSIGN_OR_RETURN(auto split, SplitAddress(address));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(split.second);
  if (int e = getaddrinfo(split.first.empty() ? nullptr : split.first.c_str(), port.c_str(), &hints,
                          &found);
      e != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot listen on ", outer::Printable(address),
                                                   ": ", gai_strerror(e)));
  }
  absl::Status result = absl::OkStatus();
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      result = absl::UnavailableError(absl::StrCat("cannot listen on ", outer::Printable(address),
                                                   ": ", std::strerror(errno)));
    }
    close(fd);
    if (!result.ok()) break;
  }
  freeaddrinfo(found);
  return result;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsFiles& tls) {
  if (tls.cert.empty() && tls.key.empty()) {
    if (!tls.ca.empty()) {
      return absl::InvalidArgumentError("--tls-ca (mutual TLS) needs --tls-cert and --tls-key");
    }
    return grpc::InsecureServerCredentials();
  }
  ATL_ASSIGN_OR_RETURN(auto pair, ReadKeyPair(tls));
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({pair.second, pair.first});
  if (!tls.ca.empty()) {
    ATL_ASSIGN_OR_RETURN(auto ca, ReadCertificates(tls.ca, "--tls-ca"));
    options.pem_root_certs = ca;
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const TlsFiles& tls) {
  if (tls.ca.empty()) {
    if (!tls.cert.empty() || !tls.key.empty()) {
      return absl::InvalidArgumentError("--tls-cert and --tls-key need --tls-ca (TLS)");
    }
    return grpc::InsecureChannelCredentials();
  }
  ATL_ASSIGN_OR_RETURN(auto ca, ReadCertificates(tls.ca, "--tls-ca"));
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ca;
  if (!tls.cert.empty() || !tls.key.empty()) {
    ATL_ASSIGN_OR_RETURN(auto pair, ReadKeyPair(tls));
    options.pem_cert_chain = pair.first;
    options.pem_private_key = pair.second;
  }
  return grpc::SslCredentials(options);
}

}  // namespace atl
