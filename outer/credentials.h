// Secrets shared with peers: fresh random credentials and a comparison that takes the same time
// wherever two strings differ.
#ifndef ATOLL_OUTER_CREDENTIALS_H_
#define ATOLL_OUTER_CREDENTIALS_H_

#include <string>

namespace atl::outer {

// 128 bits from the operating system's random source, as 32 hex characters.
std::string NewCredential();

// Compares in time independent of where the strings differ; an empty `expected` matches nothing.
bool CredentialMatches(const std::string& expected, const std::string& presented);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_CREDENTIALS_H_
