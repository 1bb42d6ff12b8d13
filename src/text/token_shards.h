// Token shards and the runs that read them: the shards' manifest (written by src/text/tokenize.h)
// and the checks a run's data must pass before training starts.
#ifndef ATOLL_SRC_TEXT_TOKEN_SHARDS_H_
#define ATOLL_SRC_TEXT_TOKEN_SHARDS_H_

#include <cstdint>
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
