#include "src/store/model_io.h"

#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "nlohmann/json.hpp"
#include "outer/base/fragments.h"
#include "src/store/checkpoint.h"
#include "src/store/flat_params.h"
#include "src/store/hf_format.h"
#include "inner/data.h"
#include "inner/model/hf_mapping.h"
#include "src/store/safetensors.h"
#include "src/store/service_state_file.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

constexpr char kStateFile[] = "service-state.pb";
constexpr char kModelSlice[] = "model/";  // TrainerState's parameter slices

int64_t ShapeNumel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A family setting in a file's metadata, as its kind is written.
nlohmann::json SettingJson(const inner::FamilySetting& s, const inner::ModelConfig& m) {
  switch (s.kind) {
    case inner::FamilySetting::Kind::kInt: return int64_t(s.value(m));
    case inner::FamilySetting::Kind::kBool: return s.value(m) != 0;
    case inner::FamilySetting::Kind::kNumber: break;
  }
  return s.value(m);
}

bool SettingFromJson(const inner::FamilySetting& s, const nlohmann::json& v, inner::ModelConfig& m) {
  switch (s.kind) {
    case inner::FamilySetting::Kind::kInt:
      if (!v.is_number_integer()) return false;
      s.set(m, double(v.get<int64_t>()));
      return true;
    case inner::FamilySetting::Kind::kBool:
      if (!v.is_boolean()) return false;
      s.set(m, v.get<bool>() ? 1 : 0);
      return true;
    case inner::FamilySetting::Kind::kNumber: break;
  }
  if (!v.is_number()) return false;
  s.set(m, v.get<double>());
  return true;
}

// The model's architecture in a file's metadata: the shared integer fields and, for any family
// but the default one (whose files predate model.arch), its name and its settings.
nlohmann::json ModelJson(const inner::ModelConfig& m) {
  nlohmann::json j;
  for (const auto& [key, field] : ArchitectureFields()) j[key] = m.*field;
  if (!inner::IsDefaultFamily(m)) {
    const inner::ModelFamily& family = inner::FamilyOf(m);
    j["arch"] = family.name;
    for (const auto& setting : family.settings) j[setting.key] = SettingJson(setting, m);
  }
  return j;
}

// Reads ModelJson's keys into `m` (files of earlier builds carry the integer fields only: the
// default family).
bool ParseModelJson(const nlohmann::json& j, inner::ModelConfig& m) {
  if (!j.is_object()) return false;
  for (const auto& [key, field] : ArchitectureFields()) {
    if (!j.contains(key) || !j[key].is_number_integer()) return false;
    m.*field = j[key].get<int>();
  }
  const inner::ModelConfig defaults;
  m.arch = defaults.arch;
  for (const inner::ModelFamily* family : inner::Families()) {
    for (const auto& setting : family->settings) {
      if (setting.exclusive) setting.set(m, setting.raw(defaults));
    }
  }
  if (!j.contains("arch")) return true;
  const inner::ModelFamily* family =
      j["arch"].is_string() ? inner::FindFamily(j["arch"].get<std::string>()) : nullptr;
  if (family == nullptr) return false;
  m.arch = family->name;
  for (const auto& setting : family->settings) {
    if (!j.contains(setting.key) || !SettingFromJson(setting, j[setting.key], m)) return false;
  }
  return true;
}

// The tensors one block of the model's family holds.
size_t ParamsPerBlock(inner::ModelConfig m) {
  m.n_layer = 1;
  const size_t one = inner::ParameterShapes(m).size();
  m.n_layer = 0;
  return one - inner::ParameterShapes(m).size();
}

// The family whose Hugging Face names a file uses (its marker tensor is there), or null.
const inner::ModelFamily* HfFamilyOf(const safetensors::File& file) {
  for (const inner::ModelFamily* family : inner::Families()) {
    if (family->hf != nullptr && file.Find(family->hf->marker) != nullptr) return family;
  }
  return nullptr;
}

std::vector<int64_t> Transposed(std::vector<int64_t> shape) {
  std::reverse(shape.begin(), shape.end());
  return shape;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

absl::Status CheckFinite(const at::Tensor& t, const std::string& name, const std::string& source) {
  if (torch::isfinite(t).all().item<bool>()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": parameter ", name, " holds a non-finite value"));
}

// ---- safetensors

// The model of a safetensors file without atoll's metadata, from its shapes (n_head from
// `config`): files of earlier builds (the default family's, atoll's names) and other tools' files
// of a family whose shapes tell its model (`hf_family`, in its Hugging Face names).
absl::StatusOr<inner::ModelConfig> ShapesModel(const safetensors::File& file,
                                               const inner::ModelFamily* hf_family,
                                               const inner::ModelConfig& base, bool have_config) {
  const inner::ModelFamily& family =
      hf_family != nullptr ? *hf_family : inner::FamilyOf(inner::ModelConfig{});
  if (family.from_shapes == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), " is a ", family.title, " file without atoll's metadata: its shapes do not "
        "tell the whole model; read the directory that holds it with its config.json"));
  }
  const inner::ShapeLookup find = [&](const std::string& name) -> const std::vector<int64_t>* {
    bool transposed = false;
    const auto* t = file.Find(hf_family != nullptr ? hf_family->hf->name(name, &transposed) : name);
    return t != nullptr ? &t->shape : nullptr;
  };
  auto m = family.from_shapes(find, base);
  if (!m.ok()) return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", m.status().message()));
  if (!have_config) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), " has no atoll.model metadata and its shapes do not show the attention "
        "heads: give --config with model.n_head"));
  }
  return m;
}

// The model a safetensors file holds: its metadata's, else its shapes' (n_head from `config`).
absl::StatusOr<inner::ModelConfig> FileModel(const safetensors::File& file,
                                             const inner::ModelFamily* hf_family,
                                             const Config* config) {
  inner::ModelConfig m = config != nullptr ? config->model : inner::ModelConfig{};
  auto it = file.metadata().find("atoll.model");
  if (it != file.metadata().end()) {
    if (!ParseModelJson(nlohmann::json::parse(it->second, nullptr, false), m)) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.path(), ": metadata atoll.model is not {n_layer, d_model, n_head, context, vocab} "
          "(with, for a family other than ", inner::ModelConfig{}.arch,
          ", arch and the family's settings)"));
    }
    // A claim of more blocks than the file holds tensors for is refused before anything is
    // listed.
    const size_t per_block = std::max<size_t>(1, ParamsPerBlock(m));
    if (m.n_layer < 0 || size_t(m.n_layer) > file.tensors().size() / per_block) {
      return absl::InvalidArgumentError(absl::StrCat(file.path(), ": metadata says ", m.n_layer,
                                                     " blocks, the file holds ",
                                                     file.tensors().size(), " tensors"));
    }
  } else {
    ATL_ASSIGN_OR_RETURN(m, ShapesModel(file, hf_family, m, config != nullptr));
  }
  if (auto s = inner::Validate(m); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", s.message()));
  }
  return m;
}

// One parameter of a safetensors file in the model's layout, its stored name noted in `expected`.
absl::StatusOr<at::Tensor> ReadParameter(const safetensors::File& file, const std::string& name,
                                         const std::vector<int64_t>& shape, const inner::HfMapping* hf,
                                         std::set<std::string>& expected) {
  bool transposed = false;
  std::string stored = hf != nullptr ? hf->name(name, &transposed) : name;
  const auto* t = file.Find(stored);
  if (t == nullptr && hf != nullptr && hf->omittable != nullptr && name == hf->omittable) {
    stored = hf->omitted_from;  // other tools tie it and omit it
    t = file.Find(stored);
  }
  expected.insert(stored);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat(file.path(), ": no tensor ", stored));
  const auto want = transposed ? Transposed(shape) : shape;
  if (t->shape != want) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", stored, " has shape ",
                                                   ShapeText(t->shape), ", the model needs ",
                                                   ShapeText(want)));
  }
  ATL_ASSIGN_OR_RETURN(auto values, file.ReadFloats(*t));
  auto tensor = torch::from_blob(values.data(), want, torch::kFloat32).clone();
  if (transposed) tensor = tensor.t().contiguous();
  ATL_RETURN_IF_ERROR(CheckFinite(tensor, stored, file.path()));
  return tensor;
}

absl::StatusOr<ModelWeights> LoadSafetensors(const std::string& path, const Config* config) {
  ATL_ASSIGN_OR_RETURN(auto file, safetensors::File::Open(path));
  const inner::ModelFamily* hf_family = HfFamilyOf(file);  // null: atoll's names
  ATL_ASSIGN_OR_RETURN(auto model, FileModel(file, hf_family, config));
  ModelWeights w;
  w.model = model;
  w.facts = {{"kind", "file"}, {"source", path}};
  for (const char* key : {"kind", "run_id", "round", "step"}) {  // what the weights are
    auto it = file.metadata().find(absl::StrCat("atoll.", key));
    if (it != file.metadata().end()) w.facts[key] = it->second;
  }
  const inner::HfMapping* hf = hf_family != nullptr ? inner::FamilyOf(w.model).hf : nullptr;
  std::set<std::string> expected;
  for (const auto& [name, shape] : inner::ParameterShapes(w.model)) {
    ATL_ASSIGN_OR_RETURN(auto tensor, ReadParameter(file, name, shape, hf, expected));
    w.params.emplace_back(name, std::move(tensor));
  }
  // Anything else is refused (a file of another model), except the family's buffers.
  for (const auto& t : file.tensors()) {
    if (!expected.count(t.name) && !(hf != nullptr && hf->is_buffer(t.name))) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", t.name, " is not a parameter of this model"));
    }
  }
  return w;
}

// ---- atoll's own sources

// The run config a state or checkpoint was written with.
absl::StatusOr<Config> ConfigNextTo(const fs::path& dir, const Config* config) {
  const fs::path file = dir / "config.toml";
  if (fs::exists(file)) return LoadConfig(file.string(), {});
  if (config != nullptr) return *config;
  return absl::NotFoundError(absl::StrCat("no config.toml in ", dir.string(),
                                          ": give the run's config with --config"));
}

absl::StatusOr<ModelWeights> LoadServiceState(const fs::path& path, const Config* given) {
  ATL_ASSIGN_OR_RETURN(auto config, ConfigNextTo(path.parent_path(), given));
  ATL_ASSIGN_OR_RETURN(auto state, ReadServiceState(path.string()));
  if (state.config_hash() != ModelConfigHash(config.model)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path.string(), " holds another model than the config's [model]"));
  }
  const Shapes shapes = inner::ParameterShapes(config.model);
  const inner::ParallelPlan model_plan = inner::PlanOf(config.model);
  std::vector<std::string> names;
  for (const auto& [name, shape] : shapes) names.push_back(name);
  ATL_ASSIGN_OR_RETURN(auto plan, outer::PlanFragments(
                                      inner::FragmentGroups(model_plan, names),
                                      config.outer.num_fragments, config.outer.fragment_pattern));
  if (plan.parameters.size() != size_t(state.fragments_size())) {
    return absl::FailedPreconditionError(
        absl::StrCat(path.string(), " has ", state.fragments_size(), " fragments, the config ",
                     plan.parameters.size()));
  }
  std::vector<at::Tensor> tensors(shapes.size());
  uint64_t rounds = 0;
  for (size_t f = 0; f < plan.parameters.size(); ++f) {
    const auto& fragment = state.fragments(int(f));
    rounds += fragment.round();
    const std::string& bytes = fragment.params();
    size_t offset = 0;
    for (size_t i : plan.parameters[f]) {
      const auto& [name, shape] = shapes[i];
      auto t = torch::empty({ShapeNumel(shape)}, torch::kFloat32);
      const size_t n = size_t(t.numel()) * sizeof(float);
      if (offset + n > bytes.size()) {
        return absl::DataLossError(absl::StrCat(path.string(), ": fragment ", f, " is too short"));
      }
      std::memcpy(t.data_ptr(), bytes.data() + offset, n);
      offset += n;
      tensors[i] = inner::ShapedView(inner::PlanOf(model_plan, name), t, shape).contiguous();
    }
    if (offset != bytes.size()) {
      return absl::DataLossError(absl::StrCat(path.string(), ": fragment ", f, " is too long"));
    }
  }
  ModelWeights w;
  w.model = config.model;
  w.facts = {{"kind", "global"},
             {"source", path.string()},
             {"run_id", state.run_id()},
             {"round", std::to_string(rounds)}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    ATL_RETURN_IF_ERROR(CheckFinite(tensors[i], shapes[i].first, path.string()));
    w.params.emplace_back(shapes[i].first, std::move(tensors[i]));
  }
  return w;
}

absl::StatusOr<ModelWeights> LoadCheckpoint(const std::string& path) {
  ATL_ASSIGN_OR_RETURN(auto ckpt, ReadCheckpoint(path));
  ATL_ASSIGN_OR_RETURN(auto config, ParseConfig(ckpt.meta.config_toml, path + " (its config)"));
  ModelWeights w;
  w.model = config.model;
  w.facts = {{"kind", "checkpoint"},
             {"source", path},
             {"run_id", config.outer.run_id},
             {"step", std::to_string(ckpt.state.step)}};
  for (const auto& [name, shape] : inner::ParameterShapes(w.model)) {
    auto flat = torch::zeros({ShapeNumel(shape)}, torch::kFloat32);
    int64_t covered = 0;
    for (const auto& slice : ckpt.state.tensors) {
      if (slice.name != kModelSlice + name) continue;
      if (slice.shape != shape || slice.offset < 0 || slice.offset + slice.values.numel() > flat.numel()) {
        return absl::DataLossError(absl::StrCat(path, ": parameter ", name, " does not fit the model"));
      }
      flat.narrow(0, slice.offset, slice.values.numel()).copy_(slice.values.to(torch::kFloat32));
      covered += slice.values.numel();
    }
    if (covered != flat.numel()) {
      return absl::DataLossError(absl::StrCat(path, ": parameter ", name, " is incomplete"));
    }
    auto whole = inner::ShapedView(inner::PlanOf(inner::PlanOf(w.model), name), flat, shape)
                     .contiguous();
    ATL_RETURN_IF_ERROR(CheckFinite(whole, name, path));
    w.params.emplace_back(name, std::move(whole));
  }
  return w;
}

bool StartsWithMagic(const fs::path& path, const char* magic) {
  char head[8] = {};
  std::ifstream in(path, std::ios::binary);
  return in.read(head, 8) && std::memcmp(head, magic, std::strlen(magic)) == 0;
}

}  // namespace

absl::StatusOr<NameStyle> ParseNameStyle(const std::string& name) {
  if (name == "hf" || name == "gpt2") return NameStyle::kHf;  // "gpt2": its name before Llama
  if (name == "atoll") return NameStyle::kAtoll;
  return absl::InvalidArgumentError(absl::StrCat("--names must be hf or atoll, got '", name, "'"));
}

namespace {

// The tokenizer a model source was trained with, where known: a Hugging Face directory's
// tokenizer.model, else data.tokenizer of the run config next to the source (a run, coordinator or
// checkpoint directory, or their files), else of `config`.
std::string TokenizerOf(const fs::path& source, const Config* config) {
  std::error_code ec;
  const bool dir = fs::is_directory(source, ec);
  if (dir && fs::is_regular_file(source / "tokenizer.model", ec)) return (source / "tokenizer.model").string();
  const fs::path base = dir ? source : source.parent_path();
  for (const fs::path& near : {base, base / "coordinator", base.parent_path(), base.parent_path().parent_path()}) {
    if (!fs::is_regular_file(near / "config.toml", ec)) continue;
    auto run = LoadConfig((near / "config.toml").string(), {});
    if (run.ok()) return run->data.tokenizer;
  }
  return config ? config->data.tokenizer : std::string();
}

absl::StatusOr<ModelWeights> LoadFrom(const std::string& source, const Config* config) {
  const fs::path path(source);
  std::error_code ec;
  if (!fs::exists(path, ec)) return absl::NotFoundError(absl::StrCat("no such file or directory: ", source));
  if (fs::is_directory(path)) {
    if (hf::IsDirectory(source)) return hf::Load(source);
    if (fs::exists(path / kStateFile)) return LoadServiceState(path / kStateFile, config);
    if (fs::exists(path / "coordinator" / kStateFile)) {
      return LoadServiceState(path / "coordinator" / kStateFile, config);
    }
    if (fs::exists(path / "manifest.json")) return LoadCheckpoint(source);
    if (fs::exists(path / "checkpoints")) {
      ATL_ASSIGN_OR_RETURN(auto latest, LatestCheckpoint(source));
      return LoadCheckpoint(latest);
    }
    return absl::NotFoundError(absl::StrCat(
        source, " holds no model: expected a coordinator's ", kStateFile,
        ", a run directory with checkpoints/, a checkpoint directory, or a Hugging Face "
        "directory (config.json and model.safetensors or its index)"));
  }
  if (StartsWithMagic(path, "ATOLLSV")) return LoadServiceState(path, config);
  if (StartsWithMagic(path, "ATOLLCK")) return LoadCheckpoint(source);
  return LoadSafetensors(source, config);
}

}  // namespace

absl::StatusOr<ModelWeights> LoadWeights(const std::string& source, const Config* config) {
  ATL_ASSIGN_OR_RETURN(auto weights, LoadFrom(source, config));
  if (!weights.facts.count("tokenizer")) {
    if (auto t = TokenizerOf(fs::path(source), config); !t.empty()) weights.facts["tokenizer"] = t;
  }
  return weights;
}

void CopyArchitecture(const inner::ModelConfig& from, inner::ModelConfig& to) {
  for (const auto& [key, field] : ArchitectureFields()) to.*field = from.*field;
  to.arch = from.arch;
  for (const inner::ModelFamily* family : inner::Families()) {
    for (const auto& setting : family->settings) setting.set(to, setting.raw(from));
  }
}

const std::vector<ArchitectureField>& ArchitectureFields() {
  static const std::vector<ArchitectureField> kFields = {
      {"n_layer", &inner::ModelConfig::n_layer}, {"d_model", &inner::ModelConfig::d_model},
      {"n_head", &inner::ModelConfig::n_head},   {"context", &inner::ModelConfig::context},
      {"vocab", &inner::ModelConfig::vocab}};
  return kFields;
}

absl::Status CheckSameArchitecture(const inner::ModelConfig& want, const inner::ModelConfig& got,
                                   const std::string& what) {
  if (want.arch != got.arch) {
    return absl::FailedPreconditionError(absl::StrCat(what, " has model.arch = \"", got.arch,
                                                      "\", the config \"", want.arch, "\""));
  }
  for (const auto& setting : inner::FamilyOf(want).settings) {
    if (setting.value(want) != setting.value(got)) {
      return absl::FailedPreconditionError(absl::StrCat(what, " has model.", setting.key, " = ",
                                                        setting.value(got), ", the config ",
                                                        setting.value(want)));
    }
  }
  for (const auto& [key, field] : ArchitectureFields()) {
    if (want.*field != got.*field) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " has model.", key, " = ", got.*field, ", the config ", want.*field));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const ModelWeights& weights, const std::string& path, NameStyle style,
                              const std::map<std::string, std::string>& extra) {
  if (style == NameStyle::kHf && inner::FamilyOf(weights.model).hf == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("model family \"", weights.model.arch,
                                                   "\" has no Hugging Face names: use --names atoll"));
  }
  std::vector<at::Tensor> keep;  // transposed copies live until written
  std::vector<safetensors::TensorView> views;
  for (const auto& [name, tensor] : weights.params) {
    bool transposed = false;
    const std::string stored = style == NameStyle::kHf ? hf::Name(weights.model, name, &transposed) : name;
    at::Tensor t = (transposed ? tensor.t() : tensor).to(torch::kFloat32).contiguous();
    keep.push_back(t);
    views.push_back({stored, t.sizes().vec(), t.data_ptr<float>(), "F32"});
  }
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"atoll.model", ModelJson(weights.model).dump()},
      {"atoll.names", style == NameStyle::kHf ? "hf" : "atoll"}};
  for (const auto& [key, value] : weights.facts) {
    if (key != "source") metadata["atoll." + key] = value;
  }
  for (const auto& [key, value] : extra) metadata[key] = value;
  return safetensors::Write(path, views, metadata);
}

absl::StatusOr<ModelWeights> InitialWeights(const Config& config) {
  const std::string what = absl::StrCat("train.init_from (", config.train.init_from, ")");
  auto w = LoadWeights(config.train.init_from, &config);
  if (!w.ok()) {
    return absl::Status(w.status().code(),
                        absl::StrCat(what, ": ", w.status().message(),
                                     inner::NotFoundNote(w.status(), config.train.init_from, "train.init_from")));
  }
  ATL_RETURN_IF_ERROR(CheckSameArchitecture(config.model, w->model, what));
  return w;
}

absl::Status CopyInto(const ModelWeights& weights,
                      const std::vector<std::pair<std::string, at::Tensor>>& params) {
  if (params.size() != weights.params.size()) {
    return absl::FailedPreconditionError(absl::StrCat("the weights hold ", weights.params.size(),
                                                      " parameters, the model ", params.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].first != weights.params[i].first ||
        !params[i].second.sizes().equals(weights.params[i].second.sizes())) {
      return absl::FailedPreconditionError(
          absl::StrCat("parameter ", params[i].first, " does not match the weights' ", weights.params[i].first));
    }
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) params[i].second.copy_(weights.params[i].second);
  return absl::OkStatus();
}

absl::Status CopyInto(const ModelWeights& weights, inner::TrainerState& state) {
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, tensor] : weights.params) by_name[kModelSlice + name] = &tensor;
  for (const auto& slice : state.tensors) {
    if (!absl::StartsWith(slice.name, kModelSlice)) continue;
    auto it = by_name.find(slice.name);
    if (it == by_name.end() || it->second->numel() < slice.offset + slice.values.numel()) {
      return absl::FailedPreconditionError(absl::StrCat("the weights have no ", slice.name));
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& slice : state.tensors) {
    if (!absl::StartsWith(slice.name, kModelSlice)) continue;
    const auto& whole = *by_name[slice.name];
    const auto flat = inner::CanonicalFlat(
        inner::PlanOf(inner::PlanOf(weights.model), slice.name.substr(std::strlen(kModelSlice))),
        whole);
    slice.values.copy_(flat.narrow(0, slice.offset, slice.values.numel()));
  }
  return absl::OkStatus();
}

}  // namespace atl
