// The commands that take a model out of a run and back in: `atoll export` (safetensors, or a
// Hugging Face directory), `atoll import` (a run config that starts from a safetensors file or
// such a directory) and `atoll generate` (samples
// text from any model source of src/store/model_io.h).
#ifndef ATOLL_SRC_CLI_MODEL_COMMANDS_H_
#define ATOLL_SRC_CLI_MODEL_COMMANDS_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "src/config/config.h"

namespace atl {

struct ExportOptions {
  std::string source;       // a model source (src/store/model_io.h)
  std::string out;          // the safetensors file (or, format hf, directory) to write
  std::string format = "safetensors";  // or "hf" (src/store/hf_format.h)
  std::string names = "hf";  // safetensors: "hf" (alias "gpt2") or "atoll"
  std::string dtype = "f32";  // hf: "f32" or "bf16"
  uint64_t max_shard_bytes = 5'000'000'000;
  std::string config_path;  // the run's config, where the source does not carry it
  std::string tokenizer;    // hf: the tokenizer to put beside the model (default: the source's)
  FILE* out_stream = stdout;
};
absl::Status RunExport(const ExportOptions& options);

struct ImportOptions {
  std::string file;         // safetensors
  std::string out;          // the run config to write (must not exist)
  std::string config_path;  // the base config: data, training and outer settings (optional)
  std::vector<Override> overrides;
  FILE* out_stream = stdout;
};
// Checks every tensor of the file against the model it describes and writes the base config with
// that [model] and train.init_from set to the file: every run command starts from it.
absl::Status RunImport(const ImportOptions& options);

struct GenerateOptions {
  std::string source;       // a model source (src/store/model_io.h)
  std::string prompt;
  std::string config_path;  // where the source does not carry its config
  int tokens = 200;         // new tokens to sample
  double temperature = 0.8;  // 0: greedy
  int top_k = 40;           // sample among the k likeliest tokens (0: all)
  double top_p = 1.0;       // then among the likeliest whose probabilities sum to p (1: all)
  bool kv_cache = true;     // one new position's work per token; else the whole window again
  std::string tokenizer;    // SentencePiece model (default: the one the source records)
  uint64_t seed = 1;
  FILE* out_stream = stdout;
};
// Prints the prompt and the sampled continuation as it goes (stdout), then the tokens per second
// (stderr). Text is bytes for a byte-level model without a tokenizer, else the tokenizer's: the
// prompt starts with its bos, and sampling stops at its eos. With the key/value cache, each token costs one
// position's work; when the cache reaches the model's context it restarts from the last half
// context of text (without it, each token re-runs the last context's worth).
absl::Status RunGenerate(const GenerateOptions& options);

}  // namespace atl

#endif  // ATOLL_SRC_CLI_MODEL_COMMANDS_H_
