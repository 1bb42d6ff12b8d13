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

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace atl {

// The edit distance between a and b, case-insensitively: insertions, deletions, substitutions
// and swaps of two neighbours ("trian" is 1 from "train").
inline size_t TypoDistance(const std::string& a_in, const std::string& b_in) {
  const std::string a = absl::AsciiStrToLower(a_in), b = absl::AsciiStrToLower(b_in);
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// The candidate a typo of `got` most likely meant, or "" when none is near. Dotted names
// ("section.key") also match by their last part across sections: "train.sync_every" finds
// "outer.sync_every", and "steps" finds "train.steps". Ties go to the earlier candidate.
inline std::string NearestName(const std::string& got, const std::vector<std::string>& candidates) {
  const auto leaf = [](const std::string& s) {
    const size_t dot = s.rfind('.');
    return dot == std::string::npos ? s : s.substr(dot + 1);
  };
  const bool got_dotted = got.find('.') != std::string::npos;
  const std::string got_leaf = leaf(got);
  // Up to a third of the letters may be wrong, at least one and at most three.
  const size_t allowed = std::clamp<size_t>(got_leaf.size() / 3, 1, 3);
  std::string best;
  size_t best_score = 2 * allowed + 2;
  for (const std::string& c : candidates) {
    if (c == got) continue;
    size_t score = TypoDistance(got, c);
    if (got.size() >= 3 && absl::StartsWithIgnoreCase(c, got)) score = std::min<size_t>(score, 1);
    if (c.find('.') != std::string::npos || got_dotted) {
      score = std::min(score, TypoDistance(got_leaf, leaf(c)) + (got_dotted ? 1 : 0));
    }
    // Between equals, one that starts as `got` does ("aync": "async" rather than "sync").
    const bool same_start = !c.empty() && !got.empty() &&
                            absl::ascii_tolower(c[0]) == absl::ascii_tolower(got[0]);
    score = 2 * score + (same_start ? 0 : 1);
    if (score < best_score) {
      best_score = score;
      best = c;
    }
  }
  return best;
}

// " (did you mean "x"?)" for the nearest candidate, or "". `quote` the value's quotes (config
// keys and commands are named in '...'), `prefix` what the name is written with ("--").
inline std::string DidYouMean(const std::string& got, const std::vector<std::string>& candidates,
                              char quote = '"', const std::string& prefix = "") {
  const std::string near = NearestName(got, candidates);
  if (near.empty()) return "";
  const std::string q(1, quote);
  return absl::StrCat(" (did you mean ", q, prefix, near, q, "?)");
}

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
  std::vector<std::string> all;
  for (size_t i = 0; i < N; ++i) {
    absl::StrAppend(&list, i == 0 ? "" : (i + 1 == N ? " or " : ", "), "\"", names[i].name, "\"");
    all.push_back(names[i].name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("must be ", list, ", got \"", text, "\"", DidYouMean(text, all)));
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
