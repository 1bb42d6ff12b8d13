#include "outer/base/names.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace atl::outer {

absl::Status ValidateName(absl::string_view name, absl::string_view what) {
  auto ok_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
  };
  bool ok = !name.empty() && name.size() <= kMaxNameLength && ok_char(name[0]) &&
            name[0] != '.' && name[0] != '_' && name[0] != '-';
  for (char c : name) ok = ok && ok_char(c);
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " ", Printable(name), " is not allowed: use 1 to ", kMaxNameLength,
      " characters of A-Z a-z 0-9 . _ - starting with a letter or digit"));
}

std::string Printable(absl::string_view s, size_t max) {
  if (s.size() <= max) return absl::StrCat("'", absl::CHexEscape(s), "'");
  return absl::StrCat("'", absl::CHexEscape(s.substr(0, max)), "'... (", s.size(), " bytes)");
}

}  // namespace atl::outer
