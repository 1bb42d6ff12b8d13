#include "inner/model/hf_mapping.h"

#include "absl/strings/str_cat.h"

namespace atl::inner::hf_json {

using json = nlohmann::json;

absl::Status Bad(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
}

absl::StatusOr<int> Int(const json& j, const char* key, const std::string& path,
                        std::optional<int> fallback) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback) return *fallback;
    return Bad(path, absl::StrCat("no ", key));
  }
  if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1 || j[key].get<int64_t>() > (1 << 30)) {
    return Bad(path, absl::StrCat(key, " must be a positive integer"));
  }
  return j[key].get<int>();
}

absl::StatusOr<double> Number(const json& j, const char* key, const std::string& path,
                              double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) return Bad(path, absl::StrCat(key, " must be a number"));
  return j[key].get<double>();
}

absl::Status Expect(const json& j, const char* key, const json& want, const std::string& path) {
  if (!j.contains(key) || j[key].is_null() || j[key] == want) return absl::OkStatus();
  return Bad(path, absl::StrCat(key, " = ", j[key].dump(), ": atoll's model has ", want.dump()));
}

}  // namespace atl::inner::hf_json
