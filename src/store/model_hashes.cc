#include "src/store/model_hashes.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compression/checksum.h"
#include "inner/model/family.h"

namespace atl {

uint64_t ModelConfigHash(const inner::ModelConfig& m) {
  // "layout 2": row-parallel weights flatten input-major (their plan's input_major); the states of
  // earlier builds hold them row-major and are refused as another model's.
  std::string s = absl::StrCat("layout 2/", m.n_layer, "/", m.d_model, "/", m.n_head, "/", m.context, "/",
                                     m.vocab, "/", m.dropout, "/", m.init_seed);
  // Any family but the default one adds its name and settings (the default family's hash stays
  // what earlier builds wrote).
  if (!inner::IsDefaultFamily(m)) {
    const inner::ModelFamily& family = inner::FamilyOf(m);
    absl::StrAppend(&s, "/", family.name);
    for (const auto& setting : family.settings) {
      const double v = setting.value(m);
      if (setting.kind == inner::FamilySetting::Kind::kNumber) {
        absl::StrAppend(&s, "/", v);
      } else {
        absl::StrAppend(&s, "/", int64_t(v));
      }
    }
  }
  return compression::Checksum(s.data(), s.size());
}

uint64_t LayoutHash(const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes) {
  std::string s = "module layout 1";
  for (const auto& [name, shape] : shapes) {
    absl::StrAppend(&s, "/", name, ":", absl::StrJoin(shape, "x"));
  }
  return compression::Checksum(s.data(), s.size());
}

}  // namespace atl
