// Secrets shared with peers: fresh random credentials and a comparison that takes the same time
// wherever two strings differ.
#ifndef ATOLL_OUTER_SERVICE_CREDENTIALS_H_
#define ATOLL_OUTER_SERVICE_CREDENTIALS_H_

#include <string>

namespace atl::outer {

// 128 bits from the operating system's random source, as 32 hex characters.
std::string NewCredential();

// SHA-256 of the credential, as 64 hex characters: what a party that must check a credential, but
// must not be able to present it, is given (the shard servers of a sharded service get the
// digests of the islands' sessions).
std::string CredentialDigest(const std::string& credential);

// Compares in time independent of where the strings differ; an empty `expected` matches nothing.
bool CredentialMatches(const std::string& expected, const std::string& presented);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_CREDENTIALS_H_
