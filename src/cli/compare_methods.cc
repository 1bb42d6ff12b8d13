#include "src/cli/compare_methods.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "compression/codec.h"
#include "compression/config_value.h"
#include "compression/status_macros.h"

namespace atl {
namespace {

// The families, as compare.methods names them; `codec`: whether "<name>_<codec>" takes one
// (required when the bare name is not a method).
struct MethodRow {
  const char* name;
  MethodKind kind;
  bool bare;   // "<name>" alone is a method
  bool codec;  // "<name>_<codec>" is one
};
constexpr MethodRow kMethods[] = {
    {.name = "baseline", .kind = MethodKind::kBaseline, .bare = true, .codec = false},
    {.name = "diloco", .kind = MethodKind::kDiloco, .bare = true, .codec = true},
    {.name = "streaming", .kind = MethodKind::kStreaming, .bare = false, .codec = true},
    {.name = "sparse", .kind = MethodKind::kSparse, .bare = false, .codec = true},
    {.name = "async", .kind = MethodKind::kAsync, .bare = true, .codec = false},
};

std::string MethodList() {
  std::vector<std::string> forms;
  for (const auto& row : kMethods) {
    if (row.bare) forms.push_back(row.name);
    if (row.codec) forms.push_back(absl::StrCat(row.name, "_<codec>"));
  }
  std::string list;
  for (size_t i = 0; i < forms.size(); ++i) {
    absl::StrAppend(&list, i == 0 ? "" : (i + 1 == forms.size() ? " or " : ", "), forms[i]);
  }
  return list;
}

}  // namespace

absl::StatusOr<Method> ParseMethod(const std::string& text) {
  for (const auto& row : kMethods) {
    const std::string name = row.name;
    if (row.bare && text == name) return Method{row.kind, "", text};
    if (row.codec && text.size() > name.size() + 1 && text.compare(0, name.size() + 1, name + "_") == 0) {
      const std::string codec = text.substr(name.size() + 1);
      if (auto parsed = compression::ParseCodec(codec); !parsed.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("compare.methods: '", text, "': ",
                                                       parsed.status().message()));
      }
      return Method{row.kind, codec, text};
    }
  }
  std::vector<std::string> names;  // every spelling, for the nearest
  for (const auto& row : kMethods) {
    if (row.bare) names.push_back(row.name);
    if (!row.codec) continue;
    for (const std::string& codec : compression::CodecNames()) {
      names.push_back(absl::StrCat(row.name, "_", codec));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("compare.methods: unknown method '", text, "'",
                                                 DidYouMean(text, names), ": the methods are ",
                                                 MethodList()));
}

absl::StatusOr<std::vector<Method>> ParseMethods(const std::string& list) {
  std::vector<Method> methods;
  for (const auto& text : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    ATL_ASSIGN_OR_RETURN(auto m, ParseMethod(std::string(text)));
    methods.push_back(std::move(m));
  }
  return methods;
}

MethodChanges ChangesOf(const Method& method, const Config& c) {
  MethodChanges m;
  if (method.kind == MethodKind::kAsync) {
    m.overrides.emplace_back("outer.mode", "async");
    auto drop = [&](const char* key, bool set, const std::string& value, const char* why) {
      if (!set) return;
      m.overrides.emplace_back(key, value);
      m.notes.push_back(absl::StrCat(key, " = ", value, " (", why, ")"));
    };
    const auto& ph = c.outer.phases;
    drop("outer.early_sync_every", ph.early_sync_every > 0, "0",
         "async islands choose their own H: no early H");
    drop("outer.auto_tune", c.outer.auto_tune, "false", "auto_tune chooses tau for sync rounds");
    drop("outer.shards", c.outer.shards > 1, "1", "a sharded service serves sync rounds");
  }
  if (!method.codec.empty()) m.overrides.emplace_back("outer.codec", method.codec);
  if (method.kind == MethodKind::kSparse) {
    // SparseLoCo: the config's top-k share (1% when it has none), error feedback (its decay and
    // the outer lr as configured or swept), plain outer SGD.
    m.overrides.emplace_back("outer.error_feedback", "true");
    m.overrides.emplace_back("outer.optimizer", "sgd");
    if (!c.outer.sparse()) m.overrides.emplace_back("outer.topk_density", "0.01");
  }
  if (method.kind == MethodKind::kStreaming) {
    const int p = c.outer.num_fragments > 1 ? c.outer.num_fragments : std::min(4, c.model.n_layer);
    m.overrides.emplace_back("outer.num_fragments", std::to_string(p));
    m.overrides.emplace_back("outer.fragment_sync_delay", "1");
    m.overrides.emplace_back("outer.fragment_update_alpha", "0.5");
  }
  return m;
}

}  // namespace atl
