#include "outer/service/credentials.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <random>

#include <openssl/sha.h>

namespace atl::outer {

namespace {

std::string Hex(const uint8_t* bytes, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 15]);
  }
  return out;
}

}  // namespace

std::string CredentialDigest(const std::string& credential) {
  uint8_t digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(credential.data()), credential.size(), digest);
  return Hex(digest, sizeof(digest));
}

std::string NewCredential() {
  uint8_t bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) got += size_t(n);
    if (n < 0 && errno != EINTR) {
      // No kernel source (never seen on Linux >= 3.17): std::random_device reads /dev/urandom.
      std::random_device rd;
      for (; got < sizeof(bytes); ++got) bytes[got] = uint8_t(rd());
    }
  }
  return Hex(bytes, sizeof(bytes));
}

bool CredentialMatches(const std::string& expected, const std::string& presented) {
  if (expected.empty() || expected.size() != presented.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(expected[i] ^ presented[i]);
  }
  return diff == 0;
}

}  // namespace atl::outer
