// The family table. A new family is its own files under inner/model/ and one row here.
#include <mutex>

#include "absl/strings/str_cat.h"
#include "compression/config_value.h"
#include "compression/status_macros.h"
#include "inner/model/family.h"
#include "inner/model/gpt/gpt_family.h"
#include "inner/model/llama/llama_family.h"

namespace atl::inner {
namespace {

// The first row is the default model.arch.
const ModelFamily* const kTable[] = {
    &gpt::kFamily,
    &llama::kFamily,
};

struct Registered {
  std::mutex mu;
  std::vector<const ModelFamily*> families;
};
Registered& registered() {
  static Registered* r = new Registered();
  return *r;
}

std::vector<std::string> FamilyNames() {
  std::vector<std::string> out;
  for (const ModelFamily* f : Families()) out.push_back(f->name);
  return out;
}

std::string NamesText() {
  const auto all = Families();
  std::string list;
  for (size_t i = 0; i < all.size(); ++i) {
    absl::StrAppend(&list, i == 0 ? "" : (i + 1 == all.size() ? " or " : ", "), "\"",
                    all[i]->name, "\"");
  }
  return list;
}

}  // namespace

std::vector<const ModelFamily*> Families() {
  std::vector<const ModelFamily*> all(std::begin(kTable), std::end(kTable));
  auto& r = registered();
  std::lock_guard<std::mutex> lock(r.mu);
  all.insert(all.end(), r.families.begin(), r.families.end());
  return all;
}

const ModelFamily* FindFamily(const std::string& arch) {
  for (const ModelFamily* f : Families()) {
    if (arch == f->name) return f;
  }
  return nullptr;
}

const ModelFamily& FamilyOf(const ModelConfig& config) {
  const ModelFamily* f = FindFamily(config.arch);
  return f != nullptr ? *f : *kTable[0];
}

bool IsDefaultFamily(const ModelConfig& config) { return &FamilyOf(config) == kTable[0]; }

absl::Status RegisterFamily(const ModelFamily* family) {
  if (family == nullptr || family->name == nullptr || FindFamily(family->name) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat(
        "model family \"", family && family->name ? family->name : "", "\" exists already"));
  }
  auto& r = registered();
  std::lock_guard<std::mutex> lock(r.mu);
  r.families.push_back(family);
  return absl::OkStatus();
}

absl::Status ValidateFamily(const ModelConfig& config) {
  const ModelFamily* family = FindFamily(config.arch);
  if (family == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.arch must be ", NamesText(), ", got \"", config.arch, "\"",
                     DidYouMean(config.arch, FamilyNames())));
  }
  // Another family's own keys are refused rather than ignored.
  const ModelConfig defaults;
  for (const ModelFamily* other : Families()) {
    if (other == family) continue;
    for (const FamilySetting& s : other->settings) {
      bool shared = false;  // a key the config's family reads too
      for (const FamilySetting& own : family->settings) shared = shared || own.key == std::string(s.key);
      if (s.exclusive && !shared) {
        if (s.raw(config) != s.raw(defaults)) {
          return absl::InvalidArgumentError(absl::StrCat("model.", s.key, " applies to model.arch = \"",
                                                         other->name, "\" only"));
        }
      }
    }
  }
  return family->validate != nullptr ? family->validate(config) : absl::OkStatus();
}

}  // namespace atl::inner
