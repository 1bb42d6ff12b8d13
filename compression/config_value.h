// Config values that are not plain numbers, strings or booleans: how every component's config
// section names the values of its enums (absl only, header only; in the lowest library so that
// compression/, inner/ and outer/ share it).
//
// A component's section (e.g. inner/model_config.h) lists its keys with a visitor,
//   template <class V> void VisitKeys(SectionConfig& c, V&& v) { v("key", c.field, "doc"); ... }
// and for every field type T that is not bool, int, int64_t, uint64_t, double or std::string it
// declares, in T's namespace (found by argument-dependent lookup),
//   absl::Status ParseConfigValue(const std::string& text, T* value);  // message names no key
//   std::string ConfigValueText(const T& value);                    // the text that parses back
// src/config/config.cc composes the sections: TOML and --key=value set the fields, values are
// parsed once when the config loads, and errors name the key.
#ifndef ATOLL_COMPRESSION_CONFIG_VALUE_H_
#define ATOLL_COMPRESSION_CONFIG_VALUE_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace atl {

template <class E>
struct EnumName {
  E value;
  const char* name;
};

// The value named `text` (case-insensitively when `any_case`), or INVALID_ARGUMENT "must be "a",
// "b" or "c", got "x"".
template <class E, size_t N>
absl::Status ParseEnumValue(const std::string& text, const EnumName<E> (&names)[N], E* out,
                            bool any_case = false) {
  for (const auto& n : names) {
    if (text == n.name || (any_case && absl::AsciiStrToLower(text) == absl::AsciiStrToLower(n.name))) {
      *out = n.value;
      return absl::OkStatus();
    }
  }
  std::string list;
  for (size_t i = 0; i < N; ++i) {
    absl::StrAppend(&list, i == 0 ? "" : (i + 1 == N ? " or " : ", "), "\"", names[i].name, "\"");
  }
  return absl::InvalidArgumentError(absl::StrCat("must be ", list, ", got \"", text, "\""));
}

template <class E, size_t N>
const char* EnumValueName(E value, const EnumName<E> (&names)[N]) {
  for (const auto& n : names) {
    if (n.value == value) return n.name;
  }
  return "?";
}

}  // namespace atl

#endif  // ATOLL_COMPRESSION_CONFIG_VALUE_H_
