#include "src/cli/model_commands.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "compression/status_macros.h"
#include "inner/torch_compat.h"
#include "src/store/atomic_file.h"
#include "src/store/hf_format.h"
#include "src/store/model_io.h"
#include "src/text/tokenizer.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

// The run config a command was given, if any.
absl::StatusOr<std::optional<Config>> OptionalConfig(const std::string& path,
                                                     const std::vector<Override>& overrides = {}) {
  if (path.empty() && overrides.empty()) return std::optional<Config>();
  ATL_ASSIGN_OR_RETURN(auto config, LoadConfig(path, overrides));
  return std::optional<Config>(std::move(config));
}

absl::StatusOr<ModelWeights> Load(const std::string& source, const std::optional<Config>& config) {
  return LoadWeights(source, config ? &*config : nullptr);
}

std::string Describe(const ModelWeights& w) {
  const auto& m = w.model;
  const inner::ModelFamily& family = inner::FamilyOf(m);
  std::string what = absl::StrFormat(
      "%d-layer %s, d_model %d, %s, context %d, vocab %d (%.2fM parameters)", m.n_layer,
      family.title, m.d_model, family.heads_text(m), m.context, m.vocab,
      double(inner::ParameterCount(m)) / 1e6);
  auto fact = [&](const char* key) {
    auto it = w.facts.find(key);
    return it == w.facts.end() ? std::string() : it->second;
  };
  if (fact("kind") == "global") {
    absl::StrAppend(&what, "; the global model of run '", fact("run_id"), "' after ", fact("round"),
                    " rounds");
  } else if (fact("kind") == "checkpoint") {
    absl::StrAppend(&what, "; run '", fact("run_id"), "' at step ", fact("step"));
  }
  return what;
}

// The distribution to sample from: temperature, then the k likeliest, then the smallest set of the
// likeliest whose probabilities reach top_p (the first token always stays).
torch::Tensor SamplingProbabilities(torch::Tensor logits, const GenerateOptions& o) {
  logits = logits / o.temperature;
  const int64_t vocab = logits.size(0);
  if (o.top_k > 0 && o.top_k < vocab) {
    const auto kth = std::get<0>(logits.topk(o.top_k))[o.top_k - 1];
    logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
  }
  auto probs = torch::softmax(logits, 0);
  if (o.top_p < 1.0) {
    auto [sorted, order] = probs.sort(/*dim=*/0, /*descending=*/true);
    // A token stays when the likelier ones before it sum to less than top_p.
    const auto before = sorted.cumsum(0) - sorted;
    const auto drop_sorted = before >= o.top_p;
    const auto drop = torch::zeros_like(drop_sorted).scatter(0, order, drop_sorted);
    probs = probs.masked_fill(drop, 0);
    probs = probs / probs.sum();
  }
  return probs;
}

// The tokenizer of a model: --tokenizer, else the one its source records; none for a byte-level
// model without one. Its vocabulary must be the model's.
absl::StatusOr<std::unique_ptr<const text::Tokenizer>> TokenizerFor(const std::string& flag,
                                                                   const ModelWeights& w) {
  std::string path = flag;
  if (path.empty()) {
    if (auto it = w.facts.find("tokenizer"); it != w.facts.end()) path = it->second;
  }
  if (path.empty()) {
    if (w.model.vocab == 256) return std::unique_ptr<const text::Tokenizer>();
    return absl::FailedPreconditionError(absl::StrCat(
        "this model has vocab ", w.model.vocab, " and its source records no tokenizer: give "
        "--tokenizer FILE (the SentencePiece model its shards were made with)"));
  }
  auto tokenizer = text::Tokenizer::Load(path);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(), absl::StrCat("tokenizer: ", tokenizer.status().message()));
  }
  if ((*tokenizer)->vocab_size() != w.model.vocab) {
    return absl::FailedPreconditionError(absl::StrCat("the tokenizer ", path, " has ",
                                                      (*tokenizer)->vocab_size(),
                                                      " tokens but the model's vocab is ", w.model.vocab));
  }
  return std::move(*tokenizer);
}

}  // namespace

absl::Status RunExport(const ExportOptions& o) {
  if (o.format != "safetensors" && o.format != "hf") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format must be safetensors or hf, got '", o.format, "'"));
  }
  if (o.dtype != "f32" && o.dtype != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("--dtype must be f32 or bf16, got '", o.dtype, "'"));
  }
  if (o.format == "safetensors" && o.dtype != "f32") {
    return absl::InvalidArgumentError("--dtype bf16 is for --format hf; safetensors files are F32");
  }
  ATL_ASSIGN_OR_RETURN(auto style, ParseNameStyle(o.names));
  if (o.out.empty()) return absl::InvalidArgumentError("--out is required");
  ATL_ASSIGN_OR_RETURN(auto config, OptionalConfig(o.config_path));
  ATL_ASSIGN_OR_RETURN(auto weights, Load(o.source, config));
  if (o.format == "hf") {
    hf::ExportOptions hf_options;
    hf_options.bf16 = o.dtype == "bf16";
    hf_options.max_shard_bytes = std::max<uint64_t>(1, o.max_shard_bytes);
    ATL_ASSIGN_OR_RETURN(auto tokenizer, TokenizerFor(o.tokenizer, weights));
    if (tokenizer) {
      hf_options.tokenizer = tokenizer->path();
      hf_options.bos_id = tokenizer->bos_id();
      hf_options.eos_id = tokenizer->eos_id();
      hf_options.unk_id = tokenizer->unk_id();
    }
    ATL_ASSIGN_OR_RETURN(auto files, hf::Write(weights, o.out, hf_options));
    std::fprintf(o.out_stream, "atoll export: %s\n  from %s\n  to %s (Hugging Face, %s): %s\n",
                 Describe(weights).c_str(), o.source.c_str(), o.out.c_str(), o.dtype.c_str(),
                 absl::StrJoin(files, ", ").c_str());
    return absl::OkStatus();
  }
  ATL_RETURN_IF_ERROR(WriteSafetensors(weights, o.out, style));
  std::fprintf(o.out_stream, "atoll export: %s\n  from %s\n  to %s (%s names, %s bytes)\n",
               Describe(weights).c_str(), o.source.c_str(), o.out.c_str(), o.names.c_str(),
               std::to_string(fs::file_size(o.out)).c_str());
  return absl::OkStatus();
}

absl::Status RunImport(const ImportOptions& o) {
  if (o.out.empty()) return absl::InvalidArgumentError("--out is required (the run config to write)");
  if (fs::exists(o.out)) {
    return absl::AlreadyExistsError(absl::StrCat("--out ", o.out, " exists; choose a new file"));
  }
  ATL_ASSIGN_OR_RETURN(auto base, LoadConfig(o.config_path, o.overrides));
  ATL_ASSIGN_OR_RETURN(auto weights, LoadWeights(o.file, &base));
  Config config = base;  // its dropout and init seed stay; the shapes are the file's (validated)
  CopyArchitecture(weights.model, config.model);
  config.train.init_from = fs::absolute(o.file).lexically_normal().string();
  // A Hugging Face directory's tokenizer comes with it (its shards must then be made with it).
  if (auto it = weights.facts.find("tokenizer"); it != weights.facts.end() && config.data.tokenizer.empty()) {
    config.data.tokenizer = fs::absolute(it->second).lexically_normal().string();
  }
  ATL_RETURN_IF_ERROR(WriteFileAtomic(o.out, ToToml(config)));
  std::fprintf(o.out_stream,
               "atoll import: %s: %s; every tensor checked\n"
               "  wrote %s ([model] from the file, train.init_from = %s)\n"
               "  start a run from it: atoll local --config %s --run-dir DIR (or train, "
               "coordinator, compare)\n",
               o.file.c_str(), Describe(weights).c_str(), o.out.c_str(),
               config.train.init_from.c_str(), o.out.c_str());
  return absl::OkStatus();
}

namespace {

// What generate reads and writes: bytes, or a tokenizer's ids (a prompt starts with its bos).
struct TextCodec {
  const text::Tokenizer* tokenizer = nullptr;
  absl::StatusOr<std::vector<int64_t>> Encode(const std::string& prompt) const {
    std::vector<int64_t> ids;
    if (!tokenizer) {
      for (unsigned char c : prompt) ids.push_back(c);  // bytes, whatever char's signedness
      return ids;
    }
    if (tokenizer->bos_id() >= 0) ids.push_back(tokenizer->bos_id());
    ATL_ASSIGN_OR_RETURN(auto encoded, tokenizer->Encode(prompt));
    ids.insert(ids.end(), encoded.begin(), encoded.end());
    return ids;
  }
  std::string Text(int64_t id) const {
    return tokenizer ? tokenizer->TokenText(uint32_t(id)) : std::string(1, char(id));
  }
  int64_t eos() const { return tokenizer ? tokenizer->eos_id() : -1; }
};

// The sampling options that need no model, each refused by name.
absl::Status CheckGenerateOptions(const GenerateOptions& o) {
  if (o.prompt.empty()) return absl::InvalidArgumentError("--prompt must not be empty");
  if (o.tokens < 1 || o.tokens > 1'000'000) {
    return absl::InvalidArgumentError(absl::StrCat("--tokens must be in [1, 1000000], got ", o.tokens));
  }
  if (!(o.temperature >= 0 && o.temperature <= 100)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--temperature must be in [0, 100] (0: greedy), got ", o.temperature));
  }
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--top-p must be in (0, 1], got ", o.top_p));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunGenerate(const GenerateOptions& o) {
  ATL_RETURN_IF_ERROR(CheckGenerateOptions(o));
  ATL_ASSIGN_OR_RETURN(auto config, OptionalConfig(o.config_path));
  ATL_ASSIGN_OR_RETURN(auto weights, Load(o.source, config));
  const auto& m = weights.model;
  if (o.top_k < 0 || o.top_k > m.vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("--top-k must be in [0, ", m.vocab, "] (0: all tokens), got ", o.top_k));
  }
  ATL_ASSIGN_OR_RETURN(auto tokenizer, TokenizerFor(o.tokenizer, weights));
  const TextCodec codec{tokenizer.get()};
  ATL_ASSIGN_OR_RETURN(std::vector<int64_t> tokens, codec.Encode(o.prompt));
  inner::ModelConfig eval_config = m;
  eval_config.dropout = 0;
  const inner::CausalLm model = inner::BuildModel(eval_config);
  ATL_RETURN_IF_ERROR(CopyInto(weights, inner::NamedParameters(*model)));
  model->eval();
  torch::NoGradGuard no_grad;
  auto generator = inner::compat::MakeCpuGenerator(o.seed);

  std::fwrite(o.prompt.data(), 1, o.prompt.size(), o.out_stream);
  auto row = [](std::vector<int64_t>::const_iterator begin, std::vector<int64_t>::const_iterator end) {
    return torch::tensor(std::vector<int64_t>(begin, end), torch::kLong).unsqueeze(0);
  };
  // The next token's logits: from the cache (the new token's position only), or the whole window.
  inner::KvCache cache;
  auto next_logits = [&]() {
    if (!o.kv_cache) {
      const size_t window = std::min(tokens.size(), size_t(m.context));
      return model->forward(row(tokens.end() - long(window), tokens.end()))[0][long(window) - 1];
    }
    if (cache.length > 0 && cache.length < m.context) {
      return model->Decode(row(tokens.end() - 1, tokens.end()), cache)[0][0];
    }
    // First call: the prompt (its last context's worth); the cache full: restart from the last
    // half context.
    const bool first = cache.length == 0;
    cache = {};
    const size_t keep = std::min(tokens.size(), size_t(first ? m.context : std::max(1, m.context / 2)));
    auto logits = model->Decode(row(tokens.end() - long(keep), tokens.end()), cache);
    return logits[0][long(keep) - 1];
  };
  const auto start = std::chrono::steady_clock::now();
  size_t generated = 0;
  bool at_eos = false;
  for (int i = 0; i < o.tokens && !at_eos; ++i) {
    auto logits = next_logits();
    int64_t next;
    if (o.temperature == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      next = torch::multinomial(SamplingProbabilities(logits, o), 1, false, generator).item<int64_t>();
    }
    if (next == codec.eos()) {
      at_eos = true;
      break;
    }
    tokens.push_back(next);
    ++generated;
    const std::string text = codec.Text(next);
    std::fwrite(text.data(), 1, text.size(), o.out_stream);
    std::fflush(o.out_stream);
  }
  std::fputc('\n', o.out_stream);
  std::fflush(o.out_stream);  // the text's end before the stats line on stderr (both may be a pipe)
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const size_t n = generated;
  std::fprintf(stderr, "atoll generate: %zu tokens in %.2f s (%.1f tokens/s, %s)%s\n", n, seconds,
               seconds > 0 ? double(n) / seconds : 0.0, o.kv_cache ? "key/value cache" : "no cache",
               at_eos ? "; stopped at the end-of-text token" : "");
  return absl::OkStatus();
}

}  // namespace atl
