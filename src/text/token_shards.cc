#include "src/text/token_shards.h"

#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "src/store/atomic_file.h"
#include "src/text/tokenizer.h"

namespace atl::text {

namespace fs = std::filesystem;

int64_t ShardManifest::tokens() const {
  int64_t n = 0;
  for (const auto& s : shards) n += s.tokens;
  return n;
}

absl::Status WriteManifest(const std::string& dir, const ShardManifest& m) {
  nlohmann::json shards = nlohmann::json::array();
  for (const auto& s : m.shards) {
    shards.push_back({{"file", s.file}, {"tokens", s.tokens}, {"text_bytes", s.text_bytes}});
  }
  const nlohmann::json j = {
      {"format", "atoll token shards"},
      {"version", 1},
      {"tokenizer", {{"path", m.tokenizer_path}, {"xxh64", m.tokenizer_hash}, {"vocab_size", m.vocab_size}}},
      {"token_bytes", m.token_width},
      {"tokens", m.tokens()},
      {"inputs", m.inputs},
      {"input_bytes", m.input_bytes},
      {"shards", shards}};
  return WriteFileAtomic((fs::path(dir) / inner::kShardManifest).string(), j.dump(1) + "\n");
}

absl::StatusOr<ShardManifest> ReadManifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / inner::kShardManifest).string();
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no ", path));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (j.is_discarded() || !j.is_object()) return bad("not JSON");
  if (j.value("format", "") != "atoll token shards" || !j.contains("version") ||
      !j["version"].is_number_integer() || j["version"].get<int>() != 1) {
    return bad("not an atoll token-shard manifest of version 1");
  }
  ShardManifest m;
  const auto& t = j.value("tokenizer", nlohmann::json::object());
  if (!t.is_object() || !t.contains("xxh64") || !t["xxh64"].is_string() || !t.contains("vocab_size") ||
      !t["vocab_size"].is_number_integer()) {
    return bad("tokenizer must hold xxh64 (a string) and vocab_size (an integer)");
  }
  m.tokenizer_path = t.value("path", "");
  m.tokenizer_hash = t["xxh64"].get<std::string>();
  m.vocab_size = t["vocab_size"].get<int64_t>();
  if (!j.contains("token_bytes") || !j["token_bytes"].is_number_integer() ||
      (j["token_bytes"] != 2 && j["token_bytes"] != 4)) {
    return bad("token_bytes must be 2 or 4");
  }
  m.token_width = j["token_bytes"].get<int>();
  if (!j.contains("shards") || !j["shards"].is_array()) return bad("shards must be an array");
  for (const auto& s : j["shards"]) {
    if (!s.is_object() || !s.contains("file") || !s["file"].is_string() || !s.contains("tokens") ||
        !s["tokens"].is_number_integer() || !s.contains("text_bytes") || !s["text_bytes"].is_number_integer()) {
      return bad("each shard needs file (a string), tokens and text_bytes (integers)");
    }
    m.shards.push_back({s["file"].get<std::string>(), s["tokens"].get<int64_t>(), s["text_bytes"].get<int64_t>()});
  }
  m.input_bytes = j.value("input_bytes", int64_t(0));
  if (j.contains("inputs") && j["inputs"].is_array()) {
    for (const auto& f : j["inputs"]) {
      if (f.is_string()) m.inputs.push_back(f.get<std::string>());
    }
  }
  return m;
}

namespace {

// The manifest beside the files a data spec names, if there is one.
absl::StatusOr<std::optional<ShardManifest>> ManifestOf(const std::string& spec) {
  ATL_ASSIGN_OR_RETURN(auto files, inner::ResolveFiles(spec));
  const std::string dir = fs::path(files.front()).parent_path().string();
  auto manifest = ReadManifest(dir.empty() ? "." : dir);
  if (absl::IsNotFound(manifest.status())) return std::optional<ShardManifest>();
  if (!manifest.ok()) return manifest.status();
  return std::optional<ShardManifest>(std::move(*manifest));
}

bool IsText(const std::string& spec) {
  auto files = inner::ResolveFiles(spec);
  return files.ok() && !absl::EndsWith(files->front(), ".bin");
}

// Checks one data spec (data.path or data.val_path) against the tokenizer and the model.
absl::Status CheckSpec(const char* key, const std::string& spec, const Tokenizer* tokenizer,
                       const std::string& tokenizer_key, const inner::ModelConfig& model) {
  if (spec.empty()) return absl::OkStatus();
  if (IsText(spec)) {
    if (tokenizer) {
      return absl::FailedPreconditionError(absl::StrCat(
          key, " = ", spec, " is text, read byte by byte; data.tokenizer is for token shards: make "
          "them with `atoll tokenize --tokenizer ", tokenizer_key, " --input ", spec, " --out DIR` "
          "and set ", key, " to DIR"));
    }
    return absl::OkStatus();
  }
  auto manifest = ManifestOf(spec);
  if (!manifest.ok()) {
    return absl::Status(manifest.status().code(),
                        absl::StrCat(key, ": ", manifest.status().message(),
                                     inner::NotFoundNote(manifest.status(), spec, key)));
  }
  if (!*manifest) return absl::OkStatus();  // shards made elsewhere (llm.c): nothing to check
  const ShardManifest& m = **manifest;
  if (!tokenizer) {
    return absl::FailedPreconditionError(absl::StrCat(
        key, " = ", spec, " holds shards made with the tokenizer ", m.tokenizer_path, " (xxh64 ",
        m.tokenizer_hash, "); set data.tokenizer to it, so the run records the tokenizer its "
        "tokens mean"));
  }
  if (m.tokenizer_hash != tokenizer->hash()) {
    return absl::FailedPreconditionError(absl::StrCat(
        key, " = ", spec, " holds shards made with another tokenizer: ", m.tokenizer_path,
        " (xxh64 ", m.tokenizer_hash, "), but data.tokenizer = ", tokenizer_key, " (xxh64 ",
        tokenizer->hash(), ")"));
  }
  if (m.vocab_size != model.vocab) {
    return absl::FailedPreconditionError(absl::StrCat(key, " = ", spec, " holds tokens of a ",
                                                      m.vocab_size, "-token vocabulary, but model.vocab = ",
                                                      model.vocab));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<const Tokenizer>> CheckedTokenizer(const inner::DataConfig& data,
                                                                  const inner::ModelConfig& model) {
  std::unique_ptr<const Tokenizer> tokenizer;
  if (!data.tokenizer.empty()) {
    auto loaded = Tokenizer::Load(data.tokenizer);
    if (!loaded.ok()) {
      std::string fix;
      if (absl::IsNotFound(loaded.status())) {
        fix = absl::StrCat(inner::RelativePathNote(data.tokenizer, "data.tokenizer"),
                           "; to train one: atoll tokenizer train --input TEXT_FILES --vocab-size ",
                           model.vocab, " --out ", data.tokenizer);
      }
      return absl::Status(loaded.status().code(),
                          absl::StrCat("data.tokenizer: ", loaded.status().message(), fix));
    }
    tokenizer = std::move(*loaded);
    if (tokenizer->vocab_size() != model.vocab) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model.vocab = ", model.vocab, " but data.tokenizer = ", data.tokenizer, " has ",
          tokenizer->vocab_size(), " tokens; set model.vocab = ", tokenizer->vocab_size()));
    }
  }
  ATL_RETURN_IF_ERROR(CheckSpec("data.path", data.path, tokenizer.get(), data.tokenizer, model));
  ATL_RETURN_IF_ERROR(CheckSpec("data.val_path", data.val_path, tokenizer.get(), data.tokenizer, model));
  return tokenizer;
}

}  // namespace

absl::Status CheckData(const inner::DataConfig& data, const inner::ModelConfig& model) {
  ATL_RETURN_IF_ERROR(inner::Validate(data));
  return CheckedTokenizer(data, model).status();
}

absl::StatusOr<std::shared_ptr<const inner::Dataset>> LoadDataset(const inner::DataConfig& data,
                                                                  const inner::ModelConfig& model) {
  ATL_RETURN_IF_ERROR(inner::Validate(data));
  ATL_ASSIGN_OR_RETURN(auto tokenizer, CheckedTokenizer(data, model));
  std::vector<float> token_bytes;
  if (tokenizer) token_bytes = tokenizer->TokenBytes();
  return inner::LoadDataset(data, model.context, model.vocab, std::move(token_bytes));
}

}  // namespace atl::text
