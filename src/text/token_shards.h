// Token shards made by `atoll tokenize` and the runs that read them: the shards' manifest, the
// tokenizing pipeline, and the checks a run's data must pass before training starts.
#ifndef ATOLL_SRC_TEXT_TOKEN_SHARDS_H_
#define ATOLL_SRC_TEXT_TOKEN_SHARDS_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inner/data.h"
#include "inner/model_config.h"

namespace atl::text {

// manifest.json beside the shards: what made them and what they hold.
struct ShardManifest {
  std::string tokenizer_path;  // absolute, when written
  std::string tokenizer_hash;  // Tokenizer::hash()
  int64_t vocab_size = 0;
  int token_width = 2;         // bytes per token in the shards (2: llm.c uint16, 4: uint32)
  struct Shard {
    std::string file;          // name within the directory
    int64_t tokens = 0;
    int64_t text_bytes = 0;    // bytes of text the tokens stand for (Tokenizer::TokenBytes)
  };
  std::vector<Shard> shards;
  std::vector<std::string> inputs;
  int64_t input_bytes = 0;
  int64_t tokens() const;
};

absl::Status WriteManifest(const std::string& dir, const ShardManifest& manifest);
// NotFound when the directory has no manifest; a malformed one is refused by field.
absl::StatusOr<ShardManifest> ReadManifest(const std::string& dir);

struct TokenizeOptions {
  std::string tokenizer;           // a SentencePiece model file
  std::vector<std::string> inputs; // text: files, directories or globs (inner::ResolveFiles)
  std::string out;                 // directory for the shards and manifest.json (created)
  int threads = 0;                 // 0: every core
  int64_t shard_tokens = 100'000'000;  // tokens per shard at most
  int token_width = 0;             // bytes per token: 0 the narrowest that holds the vocabulary, 2, 4
  size_t chunk_bytes = 8192;       // text per unit of work, cut at a line end (8 KiB: fastest here)
  bool document_marks = true;      // bos before and eos after each input file (where defined)
  FILE* progress = stderr;         // a line every progress_every_s; null: silent
  double progress_every_s = 2.0;
};

struct TokenizeResult {
  ShardManifest manifest;
  double seconds = 0;
  int threads = 0;
  int64_t peak_rss_bytes = 0;  // this process's, at the end
};

// Streams the inputs through the tokenizer: chunks of text are encoded on `threads` threads, and
// written in input order (so the shards do not depend on the thread count); at most 2 x threads
// chunks are in memory at once, whatever the corpus' size.
absl::StatusOr<TokenizeResult> Tokenize(const TokenizeOptions& options);

// The run's data, checked against its tokenizer before training starts: shards with a manifest
// whose tokenizer is not data.tokenizer, or whose vocabulary is not model.vocab, are refused by
// name; data.tokenizer with text data is refused. With a tokenizer, the dataset carries its
// token lengths (bits per byte).
absl::StatusOr<std::shared_ptr<const inner::Dataset>> LoadDataset(const inner::DataConfig& data,
                                                                  const inner::ModelConfig& model);
// The checks of LoadDataset without loading the tokens (commands run it before starting islands).
absl::Status CheckData(const inner::DataConfig& data, const inner::ModelConfig& model);

}  // namespace atl::text

#endif  // ATOLL_SRC_TEXT_TOKEN_SHARDS_H_
