#include "src/store/hf_format.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/status_macros.h"
#include "inner/model/hf_mapping.h"
#include "src/store/atomic_file.h"
#include "src/store/safetensors.h"

namespace atl::hf {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kConfig[] = "config.json";
constexpr char kSingle[] = "model.safetensors";
constexpr char kIndex[] = "model.safetensors.index.json";

using inner::hf_json::Bad;

absl::StatusOr<json> ReadJson(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Bad(path.string(), "not a JSON object");
  return j;
}

// BF16 words of `t`, rounded to nearest even (torch's conversion).
std::vector<uint16_t> Bf16Words(const at::Tensor& t) {
  const auto b = t.to(torch::kBFloat16).contiguous();
  std::vector<uint16_t> words(size_t(b.numel()));
  std::memcpy(words.data(), b.data_ptr(), words.size() * 2);
  return words;
}

struct Stored {
  std::string name;
  at::Tensor f32;               // in the stored layout
  std::vector<uint16_t> bf16;   // when exported in bf16
  uint64_t bytes() const { return bf16.empty() ? uint64_t(f32.numel()) * 4 : bf16.size() * 2; }
};

}  // namespace

std::string Name(const inner::ModelConfig& model, const std::string& atoll_name, bool* transposed) {
  *transposed = false;
  const inner::HfMapping* hf = inner::FamilyOf(model).hf;
  return hf != nullptr ? hf->name(atoll_name, transposed) : atoll_name;
}

json Config(const inner::ModelConfig& m, bool bf16) {
  const inner::HfMapping* hf = inner::FamilyOf(m).hf;
  json j = hf != nullptr ? hf->config(m) : json::object();
  j["torch_dtype"] = bf16 ? "bfloat16" : "float32";
  j["use_cache"] = true;
  return j;
}

namespace {

// The family config.json names by "architectures" (or, without it, by "model_type"), or null.
const inner::ModelFamily* FamilyNamed(const json& j) {
  const bool listed = j.contains("architectures") && j["architectures"].is_array() &&
                      !j["architectures"].empty() && j["architectures"][0].is_string();
  for (const inner::ModelFamily* family : inner::Families()) {
    if (family->hf == nullptr) continue;
    if (listed) {
      for (const char* arch : family->hf->architectures) {
        if (j["architectures"][0] == arch) return family;
      }
    } else if (j.contains("model_type") && j["model_type"] == family->hf->model_type) {
      return family;
    }
  }
  return nullptr;
}

std::string ArchitecturesRead() {
  std::vector<std::string> names;
  for (const inner::ModelFamily* family : inner::Families()) {
    if (family->hf != nullptr) names.push_back(family->hf->architectures[0]);
  }
  std::string list;
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppend(&list, i == 0 ? "" : (i + 1 == names.size() ? " and " : ", "), names[i]);
  }
  return list;
}

}  // namespace

absl::StatusOr<inner::ModelConfig> ModelOf(const json& j, const std::string& path) {
  const inner::ModelFamily* family = FamilyNamed(j);
  if (family == nullptr) {
    return Bad(path, absl::StrCat("architectures = ", j.value("architectures", json()).dump(),
                                  ": atoll reads ", ArchitecturesRead()));
  }
  ATL_ASSIGN_OR_RETURN(auto m, family->hf->model_of(j, path));
  if (auto s = inner::Validate(m); !s.ok()) return Bad(path, std::string(s.message()));
  return m;
}

namespace {

// tokenizer.model and the files transformers' LlamaTokenizer reads beside it. The tokens' texts
// are SentencePiece's own (<s>, </s>, <unk> for atoll's trained tokenizers).
absl::StatusOr<std::vector<std::string>> WriteTokenizerFiles(const ExportOptions& o, int context,
                                                             const fs::path& out) {
  std::error_code ec;
  fs::copy_file(o.tokenizer, out / "tokenizer.model", fs::copy_options::overwrite_existing, ec);
  if (ec) {
    return absl::NotFoundError(absl::StrCat("cannot copy the tokenizer ", o.tokenizer, ": ", ec.message()));
  }
  json special = json::object();
  for (const auto& [key, id, text] : {std::tuple<const char*, int, const char*>{"bos_token", o.bos_id, "<s>"},
                                      {"eos_token", o.eos_id, "</s>"}, {"unk_token", o.unk_id, "<unk>"}}) {
    if (id >= 0) special[key] = text;
  }
  json config = special;
  config["tokenizer_class"] = "LlamaTokenizer";
  config["model_max_length"] = context;
  config["add_bos_token"] = o.bos_id >= 0;
  config["add_eos_token"] = false;
  config["legacy"] = true;  // SentencePiece's encoding as it is, no prefix space added
  config["clean_up_tokenization_spaces"] = false;
  ATL_RETURN_IF_ERROR(WriteFileAtomic((out / "tokenizer_config.json").string(), config.dump(2) + "\n"));
  ATL_RETURN_IF_ERROR(WriteFileAtomic((out / "special_tokens_map.json").string(), special.dump(2) + "\n"));
  return std::vector<std::string>{"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"};
}

}  // namespace

absl::StatusOr<std::vector<std::string>> Write(const ModelWeights& w, const std::string& dir,
                                               const ExportOptions& o) {
  if (inner::FamilyOf(w.model).hf == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("model family \"", w.model.arch,
                                                   "\" has no Hugging Face mapping"));
  }
  const fs::path out(dir);
  if (fs::exists(out / kConfig)) {
    return absl::AlreadyExistsError(absl::StrCat(dir, " already holds a ", kConfig, "; choose a new directory"));
  }
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));

  // Every tensor under its name, in its stored layout and type; then shards of at most the bound
  // (a tensor larger than it gets a shard of its own).
  std::vector<Stored> stored;
  uint64_t total = 0;
  for (const auto& [name, tensor] : w.params) {
    Stored s;
    bool transposed = false;
    s.name = Name(w.model, name, &transposed);
    s.f32 = (transposed ? tensor.t() : tensor).to(torch::kFloat32).contiguous();
    if (o.bf16) s.bf16 = Bf16Words(s.f32);
    total += s.bytes();
    stored.push_back(std::move(s));
  }
  std::vector<std::vector<const Stored*>> shards(1);
  uint64_t in_shard = 0;
  for (const auto& s : stored) {
    if (!shards.back().empty() && in_shard + s.bytes() > o.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&s);
    in_shard += s.bytes();
  }
  std::vector<std::string> files;
  json weight_map = json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string file = shards.size() == 1 ? kSingle
                                                : absl::StrFormat("model-%05d-of-%05d.safetensors",
                                                                  k + 1, shards.size());
    std::vector<safetensors::TensorView> views;
    for (const Stored* s : shards[k]) {
      safetensors::TensorView v;
      v.name = s->name;
      v.shape = s->f32.sizes().vec();
      v.dtype = o.bf16 ? "BF16" : "F32";
      v.data = o.bf16 ? static_cast<const void*>(s->bf16.data()) : s->f32.data_ptr();
      views.push_back(v);
      weight_map[s->name] = file;
    }
    ATL_RETURN_IF_ERROR(safetensors::Write((out / file).string(), views, {{"format", "pt"}}));
    files.push_back(file);
  }
  if (shards.size() > 1) {
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    ATL_RETURN_IF_ERROR(WriteFileAtomic((out / kIndex).string(), index.dump(2) + "\n"));
    files.push_back(kIndex);
  }
  json config = Config(w.model, o.bf16);
  // Byte-level models have no special tokens: generation stops at the length asked for.
  json generation = {{"_from_model_config", true}, {"max_length", w.model.context}};
  for (const auto& [key, id] : {std::pair<const char*, int>{"bos_token_id", o.bos_id}, {"eos_token_id", o.eos_id}}) {
    if (id >= 0) config[key] = generation[key] = id;
  }
  ATL_RETURN_IF_ERROR(WriteFileAtomic((out / kConfig).string(), config.dump(2) + "\n"));
  files.push_back(kConfig);
  ATL_RETURN_IF_ERROR(WriteFileAtomic((out / "generation_config.json").string(), generation.dump(2) + "\n"));
  files.push_back("generation_config.json");
  if (!o.tokenizer.empty()) {
    ATL_ASSIGN_OR_RETURN(auto more, WriteTokenizerFiles(o, w.model.context, out));
    files.insert(files.end(), more.begin(), more.end());
  }
  return files;
}

bool IsDirectory(const std::string& dir) {
  const fs::path p(dir);
  std::error_code ec;
  return fs::is_directory(p, ec) && fs::exists(p / kConfig) &&
         (fs::exists(p / kSingle) || fs::exists(p / kIndex));
}

namespace {

// A directory's files, opened, and which of them holds which tensor.
struct Directory {
  std::map<std::string, std::string> where;  // tensor -> file
  std::map<std::string, safetensors::File> opened;
};

// One file, or the index's map (files inside the directory); every tensor in one file only.
absl::StatusOr<Directory> OpenDirectory(const fs::path& root) {
  Directory d;
  std::set<std::string> files;
  if (fs::exists(root / kIndex)) {
    const std::string index_path = (root / kIndex).string();
    ATL_ASSIGN_OR_RETURN(auto index, ReadJson(root / kIndex));
    if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
      return Bad(index_path, "no weight_map object");
    }
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos ||
          !absl::EndsWith(file.get<std::string>(), ".safetensors")) {
        return Bad(index_path, absl::StrCat("weight_map[", name, "] is not a .safetensors file of the directory"));
      }
      d.where[name] = file.get<std::string>();
      files.insert(file.get<std::string>());
    }
  } else {
    files.insert(kSingle);
  }
  for (const auto& f : files) {
    ATL_ASSIGN_OR_RETURN(auto file, safetensors::File::Open((root / f).string()));
    for (const auto& t : file.tensors()) {
      if (d.where.count(t.name) && d.where[t.name] != f) {
        return Bad((root / f).string(), absl::StrCat("holds ", t.name, ", which the index places in ", d.where[t.name]));
      }
      d.where[t.name] = f;
    }
    d.opened.emplace(f, std::move(file));
  }
  return d;
}

// The parameter `name` of `shape`, from its stored tensor (the mapping's name and layout).
absl::StatusOr<at::Tensor> ReadParameter(const Directory& d, const std::string& dir,
                                         const inner::HfMapping& hf, const std::string& name,
                                         const std::vector<int64_t>& shape, std::string* stored) {
  bool transposed = false;
  *stored = hf.name(name, &transposed);
  if (!d.where.count(*stored) && hf.omittable != nullptr && name == hf.omittable) {
    *stored = hf.omitted_from;  // other tools' files tie it and omit it
  }
  auto it = d.where.find(*stored);
  if (it == d.where.end()) return absl::NotFoundError(absl::StrCat(dir, ": no tensor ", *stored));
  const safetensors::File& file = d.opened.at(it->second);
  const safetensors::TensorInfo* t = file.Find(*stored);
  if (t == nullptr) return Bad(dir, absl::StrCat("the index places ", *stored, " in ", it->second, ", which lacks it"));
  std::vector<int64_t> want = shape;
  if (transposed) std::reverse(want.begin(), want.end());
  if (t->shape != want) {
    return Bad(file.path(), absl::StrCat(*stored, " has shape ", nlohmann::json(t->shape).dump(),
                                         ", the model of config.json needs ", nlohmann::json(want).dump()));
  }
  ATL_ASSIGN_OR_RETURN(auto values, file.ReadFloats(*t));
  auto tensor = torch::from_blob(values.data(), want, torch::kFloat32).clone();
  if (transposed) tensor = tensor.t().contiguous();
  if (!torch::isfinite(tensor).all().item<bool>()) {
    return Bad(file.path(), absl::StrCat(*stored, " holds a non-finite value"));
  }
  return tensor;
}

// A tensor that is not a parameter is refused, unless it is a buffer of the family's or a copy
// of the first parameter that a tied model's files may hold.
absl::Status CheckUnused(const Directory& d, const std::string& dir, const inner::HfMapping& hf,
                         const ModelWeights& w, const std::set<std::string>& used) {
  const char* tied_copy = hf.tied_copy(w.model);
  for (const auto& [name, file] : d.where) {
    if (used.count(name) || hf.is_buffer(name)) continue;
    bool copy = false;
    if (tied_copy != nullptr && name == tied_copy) {
      const auto& f = d.opened.at(file);
      ATL_ASSIGN_OR_RETURN(auto values, f.ReadFloats(*f.Find(name)));
      const auto& first = w.params.front().second;
      copy = int64_t(values.size()) == first.numel() &&
             torch::equal(torch::from_blob(values.data(), first.sizes(), torch::kFloat32), first);
    }
    if (!copy) {
      return Bad(dir, absl::StrCat("tensor ", name, " (in ", file, ") is not a parameter of this model"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelWeights> Load(const std::string& dir) {
  const fs::path root(dir);
  ATL_ASSIGN_OR_RETURN(auto config, ReadJson(root / kConfig));
  ATL_ASSIGN_OR_RETURN(auto model, ModelOf(config, (root / kConfig).string()));
  ATL_ASSIGN_OR_RETURN(auto d, OpenDirectory(root));
  const inner::HfMapping& hf = *inner::FamilyOf(model).hf;  // ModelOf found it by its mapping
  ModelWeights w;
  w.model = model;
  w.facts = {{"kind", "file"}, {"source", dir}};
  std::set<std::string> used;
  for (const auto& [name, shape] : inner::ParameterShapes(model)) {
    std::string stored;
    ATL_ASSIGN_OR_RETURN(auto tensor, ReadParameter(d, dir, hf, name, shape, &stored));
    used.insert(stored);
    w.params.emplace_back(name, std::move(tensor));
  }
  ATL_RETURN_IF_ERROR(CheckUnused(d, dir, hf, w, used));
  return w;
}

}  // namespace atl::hf
