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
#include "outer/fragments.h"
#include "src/store/checkpoint.h"
#include "src/store/flat_params.h"
#include "src/store/hf_format.h"
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

// atoll's name pieces and GPT-2's, and whether GPT-2 stores the weight transposed (Conv1D).
struct NamePiece {
  const char* atoll;
  const char* gpt2;
  bool transposed_weight;
};
constexpr NamePiece kBlockPieces[] = {{"ln1.", "ln_1.", false},
                                      {"ln2.", "ln_2.", false},
                                      {"attn.qkv.", "attn.c_attn.", true},
                                      {"attn.proj.", "attn.c_proj.", true},
                                      {"mlp.fc.", "mlp.c_fc.", true},
                                      {"mlp.proj.", "mlp.c_proj.", true}};
constexpr NamePiece kTopPieces[] = {{"tok_emb.", "transformer.wte.", false},
                                    {"pos_emb.", "transformer.wpe.", false},
                                    {"ln_f.", "transformer.ln_f.", false},
                                    {"head.", "lm_head.", false}};

// The model's architecture in a file's metadata: the integer fields, and for Llama its own keys.
nlohmann::json ModelJson(const inner::ModelConfig& m) {
  nlohmann::json j;
  for (const auto& [key, field] : ArchitectureFields()) j[key] = m.*field;
  if (m.arch == inner::ModelArch::kLlama) {
    j["arch"] = "llama";
    j["n_kv_head"] = m.kv_heads();
    j["ffn_hidden"] = m.FfnHidden();
    j["norm_eps"] = m.norm_eps;
    j["rope_theta"] = m.rope_theta;
    j["tie_embeddings"] = m.tie_embeddings;
  }
  return j;
}

// Reads ModelJson's keys into `m` (files of earlier builds carry the integer fields only: GPT-2).
bool ParseModelJson(const nlohmann::json& j, inner::ModelConfig& m) {
  if (!j.is_object()) return false;
  for (const auto& [key, field] : ArchitectureFields()) {
    if (!j.contains(key) || !j[key].is_number_integer()) return false;
    m.*field = j[key].get<int>();
  }
  m.arch = inner::ModelArch::kGpt2;
  m.n_kv_head = m.ffn_hidden = 0;
  m.tie_embeddings = false;
  if (!j.contains("arch")) return true;
  if (j["arch"] != "llama" || !j.value("n_kv_head", nlohmann::json()).is_number_integer() ||
      !j.value("ffn_hidden", nlohmann::json()).is_number_integer() ||
      !j.value("norm_eps", nlohmann::json()).is_number() ||
      !j.value("rope_theta", nlohmann::json()).is_number() ||
      !j.value("tie_embeddings", nlohmann::json()).is_boolean()) {
    return false;
  }
  m.arch = inner::ModelArch::kLlama;
  m.n_kv_head = j["n_kv_head"].get<int>();
  m.ffn_hidden = j["ffn_hidden"].get<int>();
  m.norm_eps = j["norm_eps"].get<double>();
  m.rope_theta = j["rope_theta"].get<double>();
  m.tie_embeddings = j["tie_embeddings"].get<bool>();
  return true;
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

// The model a safetensors file holds: its metadata's, else its shapes' (n_head from `config`).
absl::StatusOr<inner::ModelConfig> FileModel(const safetensors::File& file, NameStyle style,
                                             const Config* config) {
  inner::ModelConfig m = config != nullptr ? config->model : inner::ModelConfig{};
  auto it = file.metadata().find("atoll.model");
  if (it != file.metadata().end()) {
    if (!ParseModelJson(nlohmann::json::parse(it->second, nullptr, false), m)) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.path(), ": metadata atoll.model is not {n_layer, d_model, n_head, context, vocab} "
          "(with, for Llama, arch, n_kv_head, ffn_hidden, norm_eps, rope_theta, tie_embeddings)"));
    }
    // Each block is 12 tensors (Llama: 9): a claim the file cannot back is refused before
    // anything is listed.
    const size_t per_block = m.arch == inner::ModelArch::kLlama ? 9 : 12;
    if (m.n_layer < 0 || size_t(m.n_layer) > file.tensors().size() / per_block) {
      return absl::InvalidArgumentError(absl::StrCat(file.path(), ": metadata says ", m.n_layer,
                                                     " blocks, the file holds ",
                                                     file.tensors().size(), " tensors"));
    }
  } else if (file.Find("model.embed_tokens.weight") != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), " is a Llama file without atoll's metadata: its shapes do not show the heads, "
        "the norms' epsilon or the rotary base; read the directory that holds it with its "
        "config.json"));
  } else {
    const bool gpt2 = style == NameStyle::kHf;
    const auto* wte = file.Find(gpt2 ? "transformer.wte.weight" : "tok_emb.weight");
    const auto* wpe = file.Find(gpt2 ? "transformer.wpe.weight" : "pos_emb.weight");
    if (wte == nullptr || wpe == nullptr || wte->shape.size() != 2 || wpe->shape.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.path(), ": no 2-D token and position embeddings (",
          gpt2 ? "transformer.wte.weight, transformer.wpe.weight" : "tok_emb.weight, pos_emb.weight", ")"));
    }
    m.vocab = int(wte->shape[0]);
    m.d_model = int(wte->shape[1]);
    m.context = int(wpe->shape[0]);
    m.n_layer = 0;
    const std::string block = gpt2 ? "transformer.h." : "blocks.";
    while (file.Find(absl::StrCat(block, m.n_layer, gpt2 ? ".ln_1.weight" : ".ln1.weight"))) ++m.n_layer;
    if (config == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.path(), " has no atoll.model metadata and its shapes do not show the attention "
          "heads: give --config with model.n_head"));
    }
  }
  if (auto s = inner::Validate(m); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", s.message()));
  }
  return m;
}

absl::StatusOr<ModelWeights> LoadSafetensors(const std::string& path, const Config* config) {
  ATL_ASSIGN_OR_RETURN(auto file, safetensors::File::Open(path));
  const NameStyle style = file.Find("transformer.wte.weight") != nullptr ||
                                  file.Find("model.embed_tokens.weight") != nullptr
                              ? NameStyle::kHf
                              : NameStyle::kAtoll;
  ATL_ASSIGN_OR_RETURN(auto model, FileModel(file, style, config));
  ModelWeights w;
  w.model = model;
  w.facts = {{"kind", "file"}, {"source", path}};
  for (const char* key : {"kind", "run_id", "round", "step"}) {  // what the weights are
    auto it = file.metadata().find(absl::StrCat("atoll.", key));
    if (it != file.metadata().end()) w.facts[key] = it->second;
  }
  std::set<std::string> expected;
  for (const auto& [name, shape] : inner::ParameterShapes(w.model)) {
    bool transposed = false;
    std::string stored = style == NameStyle::kHf ? hf::Name(w.model, name, &transposed) : name;
    const auto* t = file.Find(stored);
    if (t == nullptr && name == "head.weight" && style == NameStyle::kHf) {
      // GPT-2 files from other tools tie the head to the token embedding and omit it.
      stored = "transformer.wte.weight";
      t = file.Find(stored);
    }
    expected.insert(stored);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat(path, ": no tensor ", stored));
    const auto want = transposed ? Transposed(shape) : shape;
    if (t->shape != want) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", stored, " has shape ",
                                                     ShapeText(t->shape), ", the model needs ",
                                                     ShapeText(want)));
    }
    ATL_ASSIGN_OR_RETURN(auto values, file.ReadFloats(*t));
    auto tensor = torch::from_blob(values.data(), want, torch::kFloat32).clone();
    if (transposed) tensor = tensor.t().contiguous();
    ATL_RETURN_IF_ERROR(CheckFinite(tensor, stored, path));
    w.params.emplace_back(name, std::move(tensor));
  }
  // Anything else is refused (a file of another model), except GPT-2's attention-mask buffers.
  for (const auto& t : file.tensors()) {
    const bool mask = style == NameStyle::kHf && (absl::EndsWith(t.name, ".attn.bias") ||
                                                    absl::EndsWith(t.name, ".attn.masked_bias"));
    if (!expected.count(t.name) && !mask) {
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

std::string Gpt2Name(const std::string& atoll_name, bool* transposed) {
  *transposed = false;
  const bool weight = absl::EndsWith(atoll_name, ".weight");
  if (absl::StartsWith(atoll_name, "blocks.")) {
    const size_t dot = atoll_name.find('.', 7);
    const std::string layer = atoll_name.substr(7, dot - 7), rest = atoll_name.substr(dot + 1);
    for (const auto& p : kBlockPieces) {
      if (absl::StartsWith(rest, p.atoll)) {
        *transposed = p.transposed_weight && weight;
        return absl::StrCat("transformer.h.", layer, ".", p.gpt2, rest.substr(std::strlen(p.atoll)));
      }
    }
  }
  for (const auto& p : kTopPieces) {
    if (absl::StartsWith(atoll_name, p.atoll)) {
      return absl::StrCat(p.gpt2, atoll_name.substr(std::strlen(p.atoll)));
    }
  }
  return atoll_name;
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
  to.n_kv_head = from.n_kv_head;
  to.ffn_hidden = from.ffn_hidden;
  to.norm_eps = from.norm_eps;
  to.rope_theta = from.rope_theta;
  to.tie_embeddings = from.tie_embeddings;
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
    return absl::FailedPreconditionError(absl::StrCat(what, " has model.arch = \"",
                                                      inner::ConfigValueText(got.arch), "\", the config \"",
                                                      inner::ConfigValueText(want.arch), "\""));
  }
  if (want.arch == inner::ModelArch::kLlama) {
    const std::pair<const char*, std::pair<double, double>> llama[] = {
        {"n_kv_head", {want.kv_heads(), got.kv_heads()}},
        {"ffn_hidden", {want.FfnHidden(), got.FfnHidden()}},
        {"norm_eps", {want.norm_eps, got.norm_eps}},
        {"rope_theta", {want.rope_theta, got.rope_theta}},
        {"tie_embeddings", {want.tie_embeddings, got.tie_embeddings}}};
    for (const auto& [key, values] : llama) {
      if (values.first != values.second) {
        return absl::FailedPreconditionError(absl::StrCat(what, " has model.", key, " = ",
                                                          values.second, ", the config ", values.first));
      }
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
  if (!w.ok()) return absl::Status(w.status().code(), absl::StrCat(what, ": ", w.status().message()));
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
