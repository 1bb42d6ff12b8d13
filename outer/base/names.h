// Names that come from peers (island names, run ids): which are acceptable, and how any string a
// peer sent is shown in messages and logs (bounded, escaped: never a raw newline, NUL or 15 MB).
#ifndef ATOLL_OUTER_BASE_NAMES_H_
#define ATOLL_OUTER_BASE_NAMES_H_

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace atl::outer {

inline constexpr size_t kMaxNameLength = 64;

// OK for 1 to 64 characters of [A-Za-z0-9._-] starting with a letter or digit; otherwise
// INVALID_ARGUMENT naming `what` and showing the name as Printable() does.
absl::Status ValidateName(absl::string_view name, absl::string_view what);

// `s` quoted, C-escaped and cut to at most `max` input bytes (with "..." and the full length when
// cut), for error messages and logs.
std::string Printable(absl::string_view s, size_t max = kMaxNameLength);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_NAMES_H_
