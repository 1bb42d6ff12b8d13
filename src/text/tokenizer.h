// Tokenizers through SentencePiece (BPE and unigram): trained here with `atoll tokenizer train`,
// or the tokenizer.model files of Llama 2, Mistral and their kin. This header keeps the library
// out of its includers: only tokenizer.cc sees SentencePiece.
#ifndef ATOLL_SRC_TEXT_TOKENIZER_H_
#define ATOLL_SRC_TEXT_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace atl::text {

namespace spm {
class Processor;  // sentencepiece_bridge.h
}

class Tokenizer {
 public:
  // Reads a SentencePiece model file; a file that is not one is refused by name.
  static absl::StatusOr<std::unique_ptr<const Tokenizer>> Load(const std::string& path);
  ~Tokenizer();

  int vocab_size() const;
  int bos_id() const;  // -1: the model has none
  int eos_id() const;  // -1: the model has none
  int unk_id() const;
  // Safe to call from several threads at once.
  absl::StatusOr<std::vector<uint32_t>> Encode(std::string_view text) const;
  // Ids outside the vocabulary are refused by value.
  absl::StatusOr<std::string> Decode(const std::vector<uint32_t>& ids) const;
  // The text one token stands for: its piece with the word-boundary mark as the space it
  // replaces; a byte-fallback piece's byte; nothing for control and unknown pieces. Generated text
  // is these, one after another (Decode would drop a leading space of the first).
  std::string TokenText(uint32_t id) const;
  // TokenText(id).size() for every id: the bytes of text each token stands for (bits per byte
  // divide by these).
  std::vector<float> TokenBytes() const;

  const std::string& path() const { return path_; }
  // XXH64 of the model file, as 16 hex digits: what shard manifests and runs record.
  const std::string& hash() const { return hash_; }

 private:
  Tokenizer(std::unique_ptr<spm::Processor> processor, std::string path, std::string hash);
  std::unique_ptr<spm::Processor> processor_;
  std::string path_, hash_;
};

// `atoll tokenizer train`: SentencePiece's trainer over text files (one sentence per line; lines
// longer than its maximum are skipped). The model treats text as it is (no normalization, spaces
// kept), so decoding gives back the text exactly; bytes outside its pieces fall back to byte
// tokens. Ids: 0 <unk>, 1 <s> (bos), 2 </s> (eos).
struct TrainOptions {
  std::vector<std::string> inputs;  // text files
  std::string out;                  // the model file to write (…/tok.model)
  int vocab_size = 8000;
  std::string model_type = "bpe";   // or "unigram"
  int threads = 0;                  // 0: every core
  int64_t max_sentences = 2'000'000;  // lines sampled from large inputs (0: all)
};
absl::Status TrainTokenizer(const TrainOptions& options);

// The XXH64 of a file as 16 hex digits.
absl::StatusOr<std::string> FileHash(const std::string& path);

}  // namespace atl::text

#endif  // ATOLL_SRC_TEXT_TOKENIZER_H_
