#include "src/config/config.h"

#include <toml++/toml.h>

#include <charconv>
#include <cinttypes>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "compression/config_value.h"
#include "compression/status_macros.h"

namespace atl {
namespace {

// A key of the schema, bound to the field it sets.
struct Field {
  std::string key;
  std::string doc;
  std::function<absl::Status(const toml::node&, const std::string& where)> from_toml;
  std::function<absl::Status(const std::string& text)> from_text;
  std::function<void(toml::table& section, const std::string& name)> to_toml;
};

template <class T>
constexpr bool kPlain = std::is_same_v<T, bool> || std::is_same_v<T, int> ||
                        std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t> ||
                        std::is_same_v<T, double> || std::is_same_v<T, std::string>;

absl::Status WrongType(const std::string& key, const std::string& where, const char* want,
                       const toml::node& node) {
  std::ostringstream got;
  got << node.type();
  return absl::InvalidArgumentError(
      absl::StrCat("config key '", key, "'", where, " must be ", want, ", got ", got.str()));
}

// A plain field from TOML, refusing wrong types and values that do not fit.
template <class T>
absl::Status PlainFromToml(const std::string& key, const toml::node& node, const std::string& where,
                           T* target) {
  if constexpr (std::is_same_v<T, std::string>) {
    if (!node.is_string()) return WrongType(key, where, "a string", node);
    *target = *node.value<std::string>();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!node.is_boolean()) return WrongType(key, where, "true or false", node);
    *target = *node.value<bool>();
  } else if constexpr (std::is_same_v<T, double>) {
    if (!node.is_number()) return WrongType(key, where, "a number", node);
    *target = *node.value<double>();
  } else {
    if (!node.is_integer()) return WrongType(key, where, "an integer", node);
    const int64_t v = *node.value<int64_t>();
    if constexpr (std::is_same_v<T, uint64_t>) {
      if (v < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("config key '", key, "'", where, " must be >= 0, got ", v));
      }
    } else if (v < int64_t(std::numeric_limits<T>::min()) ||
               v > int64_t(std::numeric_limits<T>::max())) {
      return absl::OutOfRangeError(
          absl::StrCat("config key '", key, "'", where, " is out of range: ", v));
    }
    *target = T(v);
  }
  return absl::OkStatus();
}

template <class T>
absl::Status PlainFromText(const std::string& key, const std::string& text, T* target) {
  auto wrong = [&](const char* want) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", key, ": expected ", want, ", got '", text, "'"));
  };
  if constexpr (std::is_same_v<T, std::string>) {
    *target = text;
  } else if constexpr (std::is_same_v<T, bool>) {
    if (text != "true" && text != "false") return wrong("true or false");
    *target = text == "true";
  } else if constexpr (std::is_same_v<T, double>) {
    double v;
    if (!absl::SimpleAtod(text, &v)) return wrong("a number");
    *target = v;
  } else {
    T v;
    if (!absl::SimpleAtoi(text, &v)) return wrong("an integer in range");
    *target = v;
  }
  return absl::OkStatus();
}

// A typed value (compression/config_value.h): its text parsed by its component. The message of
// a refusal names the key ("outer.mode must be ...", "outer.codec: unknown codec ...").
template <class T>
absl::Status TypedFromText(const std::string& key, const std::string& text, T* target) {
  T value = *target;
  if (absl::Status s = ParseConfigValue(text, &value); !s.ok()) {
    const bool sentence = absl::StartsWith(s.message(), "must ");
    return absl::Status(s.code(), absl::StrCat(key, sentence ? " " : ": ", s.message()));
  }
  *target = value;
  return absl::OkStatus();
}

template <class T>
Field MakeField(std::string key, T* target, std::string doc) {
  Field f{key, std::move(doc), nullptr, nullptr, nullptr};
  if constexpr (kPlain<T>) {
    f.from_toml = [key, target](const toml::node& node, const std::string& where) {
      return PlainFromToml(key, node, where, target);
    };
    f.from_text = [key, target](const std::string& text) {
      return PlainFromText(key, text, target);
    };
    f.to_toml = [target](toml::table& table, const std::string& name) {
      if constexpr (std::is_same_v<T, uint64_t>) {
        table.insert(name, int64_t(*target));
      } else {
        table.insert(name, *target);
      }
    };
  } else {
    f.from_toml = [key, target](const toml::node& node, const std::string& where) {
      // A number is its text (outer.grace = 2.5 as "2.5"); the value's parser judges it.
      if (node.is_integer()) return TypedFromText(key, absl::StrCat(*node.value<int64_t>()), target);
      if (node.is_floating_point()) {
        return TypedFromText(key, absl::StrCat(*node.value<double>()), target);
      }
      if (!node.is_string()) return WrongType(key, where, "a string", node);
      return TypedFromText(key, *node.value<std::string>(), target);
    };
    f.from_text = [key, target](const std::string& text) {
      return TypedFromText(key, text, target);
    };
    f.to_toml = [target](toml::table& table, const std::string& name) {
      table.insert(name, ConfigValueText(*target));
    };
  }
  return f;
}

// Collects a section's keys (its VisitKeys) under "<section>.".
class Collect {
 public:
  Collect(std::vector<Field>& out, const char* section) : out_(out), section_(section) {}
  template <class T, class Doc>
  void operator()(const char* name, T& field, const Doc& doc) {
    out_.push_back(MakeField(absl::StrCat(section_, ".", name), &field, std::string(doc)));
  }

 private:
  std::vector<Field>& out_;
  const char* section_;
};

template <class Section>
void AddSection(std::vector<Field>& out, Section& section) {
  VisitKeys(section, Collect(out, Section::kSection));
}

std::vector<Field> Schema(Config& c) {
  std::vector<Field> out;
  AddSection(out, c.model);
  AddSection(out, c.data);
  AddSection(out, c.train);
  AddSection(out, c.optim);
  AddSection(out, c.activation_checkpoint);
  AddSection(out, c.parallelism);
  AddSection(out, c.outer);
  AddSection(out, c.compare);
  return out;
}

Field* Find(std::vector<Field>& schema, const std::string& key) {
  for (auto& f : schema) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

// "unknown config key 'train.sync_every' in run.toml (did you mean 'outer.sync_every'?)".
absl::Status Unknown(const std::string& key, const std::string& where,
                     const std::vector<Field>& schema) {
  std::vector<std::string> keys;
  for (const auto& f : schema) keys.push_back(f.key);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown config key '", key, "'", where, DidYouMean(key, keys, '\'')));
}

absl::Status Walk(const toml::table& table, const std::string& prefix, std::vector<Field>& schema,
                  const std::string& where) {
  for (const auto& [k, node] : table) {
    const std::string key =
        prefix.empty() ? std::string(k.str()) : absl::StrCat(prefix, ".", std::string(k.str()));
    if (const auto* sub = node.as_table()) {
      ATL_RETURN_IF_ERROR(Walk(*sub, key, schema, where));
      continue;
    }
    Field* f = Find(schema, key);
    if (f == nullptr) return Unknown(key, where, schema);
    ATL_RETURN_IF_ERROR(f->from_toml(node, where));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<Override>> ParseOverrides(const std::vector<std::string>& args) {
  std::vector<Override> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!absl::StartsWith(a, "--") || a.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "'"));
    }
    const auto eq = a.find('=');
    if (eq != std::string::npos) {
      out.emplace_back(a.substr(2, eq - 2), a.substr(eq + 1));
    } else if (i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--")) {
      out.emplace_back(a.substr(2), args[i + 1]);
      ++i;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("option '", a, "' needs a value (", a, "=VALUE)"));
    }
  }
  return out;
}

absl::Status Validate(const Config& config) {
  ATL_RETURN_IF_ERROR(inner::Validate(config.model));
  ATL_RETURN_IF_ERROR(inner::Validate(config.data));
  ATL_RETURN_IF_ERROR(inner::Validate(config.train));
  ATL_RETURN_IF_ERROR(inner::Validate(config.optim, config.train));
  ATL_RETURN_IF_ERROR(inner::parallel::Validate(config.parallelism));
  ATL_RETURN_IF_ERROR(
      inner::parallel::ValidateForModel(config.parallelism, config.model, config.train));
  return outer::Validate(config.outer);
}

namespace {

// The overrides on top of what `table` set, then validation.
absl::StatusOr<Config> Resolve(const toml::table& table, const std::string& where,
                               const std::vector<Override>& overrides,
                               ConfigChecks checks = ConfigChecks::kAll) {
  Config config;
  auto schema = Schema(config);
  ATL_RETURN_IF_ERROR(Walk(table, "", schema, where));
  for (const auto& [key, value] : overrides) {
    Field* f = Find(schema, key);
    if (f == nullptr) return Unknown(key, " (command line)", schema);
    ATL_RETURN_IF_ERROR(f->from_text(value));
  }
  if (checks == ConfigChecks::kAll) ATL_RETURN_IF_ERROR(Validate(config));
  return config;
}

absl::Status ParseError(const toml::parse_error& e, const std::string& source) {
  const auto& src = e.source();
  return absl::InvalidArgumentError(absl::StrCat("config ", source, ":", src.begin.line, ":",
                                                 src.begin.column, ": ",
                                                 std::string(e.description())));
}

}  // namespace

absl::StatusOr<Config> LoadConfig(const std::string& path, const std::vector<Override>& overrides,
                                  ConfigChecks checks) {
  toml::table table;
  if (!path.empty()) {
    try {
      table = toml::parse_file(path);
    } catch (const toml::parse_error& e) {
      if (absl::StrContains(std::string(e.description()), "File could not be opened")) {
        return absl::NotFoundError(absl::StrCat("cannot open config file ", path));
      }
      return ParseError(e, "file " + path);
    }
  }
  return Resolve(table, path.empty() ? "" : absl::StrCat(" in ", path), overrides, checks);
}

absl::StatusOr<Config> ParseConfig(const std::string& toml_text, const std::string& source,
                                   const std::vector<Override>& overrides) {
  toml::table table;
  try {
    table = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    return ParseError(e, source);
  }
  return Resolve(table, absl::StrCat(" in ", source), overrides);
}

namespace {

// The shortest decimal that reads back as `v`, as a TOML float ("0.9", "1e-05", "10000.0").
std::string ShortestFloat(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char text[40];
  std::string out(text, std::to_chars(text, text + sizeof(text), v).ptr);
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}

}  // namespace

std::string ToToml(const Config& config) {
  Config copy = config;
  toml::table root;
  for (const auto& f : Schema(copy)) {
    const auto dot = f.key.find('.');
    const std::string section = f.key.substr(0, dot), name = f.key.substr(dot + 1);
    if (!root.contains(section)) root.insert(section, toml::table{});
    f.to_toml(*root[section].as_table(), name);
  }
  // toml++ prints floats with 17 digits (0.90000000000000002): each key is written here, a float
  // as the shortest text that reads back as the same double (0.9), anything else by toml++.
  std::ostringstream out;
  for (const auto& [section, node] : root) {
    if (out.tellp() > 0) out << "\n";
    out << "[" << section.str() << "]\n";
    for (const auto& [name, value] : *node.as_table()) {
      out << name.str() << " = ";
      value.visit([&out](const auto& v) {
        if constexpr (toml::is_floating_point<decltype(v)>) {
          out << ShortestFloat(*v);
        } else {
          out << v;
        }
      });
      out << "\n";
    }
  }
  return out.str();
}

std::vector<std::pair<std::string, std::string>> DescribeKeys() {
  Config c;
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : Schema(c)) out.emplace_back(f.key, f.doc);
  return out;
}

}  // namespace atl
