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
#include "src/store/atomic_file.h"
#include "src/store/safetensors.h"

namespace atl::hf {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kConfig[] = "config.json";
constexpr char kSingle[] = "model.safetensors";
constexpr char kIndex[] = "model.safetensors.index.json";

bool Llama(const inner::ModelConfig& m) { return m.arch == inner::ModelArch::kLlama; }

absl::Status Bad(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
}

absl::StatusOr<json> ReadJson(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Bad(path.string(), "not a JSON object");
  return j;
}

// The value of `key` as an int (required, or `fallback` when absent and fallback is given).
absl::StatusOr<int> Int(const json& j, const char* key, const std::string& path,
                        std::optional<int> fallback = std::nullopt) {
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

// `key`, when present, must equal `want`.
absl::Status Expect(const json& j, const char* key, const json& want, const std::string& path) {
  if (!j.contains(key) || j[key].is_null() || j[key] == want) return absl::OkStatus();
  return Bad(path, absl::StrCat(key, " = ", j[key].dump(), ": atoll's model has ", want.dump()));
}

absl::StatusOr<inner::ModelConfig> LlamaOf(const json& j, const std::string& path) {
  inner::ModelConfig m;
  m.arch = inner::ModelArch::kLlama;
  ATL_ASSIGN_OR_RETURN(m.d_model, Int(j, "hidden_size", path));
  ATL_ASSIGN_OR_RETURN(m.ffn_hidden, Int(j, "intermediate_size", path));
  ATL_ASSIGN_OR_RETURN(m.n_head, Int(j, "num_attention_heads", path));
  ATL_ASSIGN_OR_RETURN(m.n_kv_head, Int(j, "num_key_value_heads", path, m.n_head));
  ATL_ASSIGN_OR_RETURN(m.n_layer, Int(j, "num_hidden_layers", path));
  ATL_ASSIGN_OR_RETURN(m.context, Int(j, "max_position_embeddings", path));
  ATL_ASSIGN_OR_RETURN(m.vocab, Int(j, "vocab_size", path));
  ATL_ASSIGN_OR_RETURN(m.norm_eps, Number(j, "rms_norm_eps", path, 1e-6));
  ATL_ASSIGN_OR_RETURN(m.rope_theta, Number(j, "rope_theta", path, 10000));
  if (j.contains("tie_word_embeddings") && !j["tie_word_embeddings"].is_boolean()) {
    return Bad(path, "tie_word_embeddings must be true or false");
  }
  m.tie_embeddings = j.value("tie_word_embeddings", false);
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    return Bad(path, absl::StrCat("rope_scaling = ", j["rope_scaling"].dump(),
                                  ": atoll's rotary embeddings have no scaling"));
  }
  ATL_RETURN_IF_ERROR(Expect(j, "hidden_act", "silu", path));
  ATL_RETURN_IF_ERROR(Expect(j, "attention_bias", false, path));
  ATL_RETURN_IF_ERROR(Expect(j, "mlp_bias", false, path));
  ATL_RETURN_IF_ERROR(Expect(j, "head_dim", m.d_model / m.n_head, path));
  return m;
}

absl::StatusOr<inner::ModelConfig> Gpt2Of(const json& j, const std::string& path) {
  inner::ModelConfig m;
  ATL_ASSIGN_OR_RETURN(m.d_model, Int(j, "n_embd", path));
  ATL_ASSIGN_OR_RETURN(m.n_head, Int(j, "n_head", path));
  ATL_ASSIGN_OR_RETURN(m.n_layer, Int(j, "n_layer", path));
  ATL_ASSIGN_OR_RETURN(m.context, Int(j, "n_positions", path));
  ATL_ASSIGN_OR_RETURN(m.vocab, Int(j, "vocab_size", path));
  ATL_RETURN_IF_ERROR(Expect(j, "layer_norm_epsilon", 1e-5, path));
  ATL_RETURN_IF_ERROR(Expect(j, "activation_function", "gelu_new", path));
  if (j.contains("n_inner") && !j["n_inner"].is_null() && j["n_inner"] != 4 * m.d_model) {
    return Bad(path, absl::StrCat("n_inner = ", j["n_inner"].dump(), ": atoll's GPT-2 MLP is 4 x n_embd"));
  }
  return m;
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
  if (!Llama(model)) return Gpt2Name(atoll_name, transposed);
  *transposed = false;
  return atoll_name == "lm_head.weight" ? atoll_name : "model." + atoll_name;
}

json Config(const inner::ModelConfig& m, bool bf16) {
  json j;
  if (Llama(m)) {
    j = {{"architectures", {"LlamaForCausalLM"}},
         {"model_type", "llama"},
         {"hidden_size", m.d_model},
         {"intermediate_size", m.FfnHidden()},
         {"num_attention_heads", m.n_head},
         {"num_key_value_heads", m.kv_heads()},
         {"num_hidden_layers", m.n_layer},
         {"head_dim", m.d_model / m.n_head},
         {"rms_norm_eps", m.norm_eps},
         {"rope_theta", m.rope_theta},
         {"rope_scaling", nullptr},
         {"max_position_embeddings", m.context},
         {"vocab_size", m.vocab},
         {"tie_word_embeddings", m.tie_embeddings},
         {"hidden_act", "silu"},
         {"attention_bias", false},
         {"attention_dropout", 0.0},
         {"mlp_bias", false},
         {"initializer_range", 0.02}};
  } else {
    j = {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"n_embd", m.d_model},
         {"n_head", m.n_head},
         {"n_layer", m.n_layer},
         {"n_positions", m.context},
         {"n_ctx", m.context},
         {"vocab_size", m.vocab},
         {"layer_norm_epsilon", 1e-5},
         {"activation_function", "gelu_new"},
         {"tie_word_embeddings", false},
         {"resid_pdrop", 0.0},
         {"embd_pdrop", 0.0},
         {"attn_pdrop", 0.0},
         {"initializer_range", 0.02}};
  }
  j["torch_dtype"] = bf16 ? "bfloat16" : "float32";
  j["use_cache"] = true;
  return j;
}

absl::StatusOr<inner::ModelConfig> ModelOf(const json& j, const std::string& path) {
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    arch = j["architectures"][0].get<std::string>();
  } else if (j.contains("model_type") && j["model_type"].is_string()) {
    arch = j["model_type"] == "llama" ? "LlamaForCausalLM"
                                      : j["model_type"] == "gpt2" ? "GPT2LMHeadModel" : "";
  }
  absl::StatusOr<inner::ModelConfig> m = Bad(path, "");
  if (arch == "LlamaForCausalLM" || arch == "MistralForCausalLM") {
    m = LlamaOf(j, path);
  } else if (arch == "GPT2LMHeadModel") {
    m = Gpt2Of(j, path);
  } else {
    return Bad(path, absl::StrCat("architectures = ", j.value("architectures", json()).dump(),
                                  ": atoll reads LlamaForCausalLM and GPT2LMHeadModel"));
  }
  if (!m.ok()) return m.status();
  if (auto s = inner::Validate(*m); !s.ok()) return Bad(path, std::string(s.message()));
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

absl::StatusOr<ModelWeights> Load(const std::string& dir) {
  const fs::path root(dir);
  ATL_ASSIGN_OR_RETURN(auto config, ReadJson(root / kConfig));
  ATL_ASSIGN_OR_RETURN(auto model, ModelOf(config, (root / kConfig).string()));
  // Which file holds which tensor: one file, or the index's map (files inside the directory).
  std::map<std::string, std::string> where;
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
      where[name] = file.get<std::string>();
      files.insert(file.get<std::string>());
    }
  } else {
    files.insert(kSingle);
  }
  std::map<std::string, safetensors::File> opened;
  for (const auto& f : files) {
    ATL_ASSIGN_OR_RETURN(auto file, safetensors::File::Open((root / f).string()));
    for (const auto& t : file.tensors()) {
      if (where.count(t.name) && where[t.name] != f) {
        return Bad((root / f).string(), absl::StrCat("holds ", t.name, ", which the index places in ", where[t.name]));
      }
      where[t.name] = f;
    }
    opened.emplace(f, std::move(file));
  }
  ModelWeights w;
  w.model = model;
  w.facts = {{"kind", "file"}, {"source", dir}};
  std::set<std::string> used;
  for (const auto& [name, shape] : inner::ParameterShapes(model)) {
    bool transposed = false;
    std::string stored = Name(model, name, &transposed);
    if (!where.count(stored) && !Llama(model) && name == "head.weight") {
      stored = "transformer.wte.weight";  // GPT-2 files of other tools tie the head and omit it
    }
    auto it = where.find(stored);
    if (it == where.end()) return absl::NotFoundError(absl::StrCat(dir, ": no tensor ", stored));
    const safetensors::File& file = opened.at(it->second);
    const safetensors::TensorInfo* t = file.Find(stored);
    if (t == nullptr) return Bad(dir, absl::StrCat("the index places ", stored, " in ", it->second, ", which lacks it"));
    std::vector<int64_t> want = shape;
    if (transposed) std::reverse(want.begin(), want.end());
    if (t->shape != want) {
      return Bad(file.path(), absl::StrCat(stored, " has shape ", nlohmann::json(t->shape).dump(),
                                           ", the model of config.json needs ", nlohmann::json(want).dump()));
    }
    ATL_ASSIGN_OR_RETURN(auto values, file.ReadFloats(*t));
    auto tensor = torch::from_blob(values.data(), want, torch::kFloat32).clone();
    if (transposed) tensor = tensor.t().contiguous();
    if (!torch::isfinite(tensor).all().item<bool>()) {
      return Bad(file.path(), absl::StrCat(stored, " holds a non-finite value"));
    }
    used.insert(stored);
    w.params.emplace_back(name, std::move(tensor));
  }
  for (const auto& [name, file] : where) {
    if (used.count(name)) continue;
    const bool buffer = absl::EndsWith(name, ".rotary_emb.inv_freq") ||
                        (!Llama(model) && (absl::EndsWith(name, ".attn.bias") ||
                                           absl::EndsWith(name, ".attn.masked_bias")));
    bool tied_copy = false;
    if (Llama(model) && model.tie_embeddings && name == "lm_head.weight") {
      const auto* t = opened.at(file).Find(name);
      ATL_ASSIGN_OR_RETURN(auto values, opened.at(file).ReadFloats(*t));
      const auto& embed = w.params.front().second;  // embed_tokens.weight comes first
      tied_copy = int64_t(values.size()) == embed.numel() &&
                  torch::equal(torch::from_blob(values.data(), embed.sizes(), torch::kFloat32), embed);
    }
    if (!buffer && !tied_copy) {
      return Bad(dir, absl::StrCat("tensor ", name, " (in ", file, ") is not a parameter of this model"));
    }
  }
  return w;
}

}  // namespace atl::hf
