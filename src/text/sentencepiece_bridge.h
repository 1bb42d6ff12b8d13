// SentencePiece for atoll: the library's processor and trainer, reached through the module of
// sentencepiece_api.h (loaded on first use). Standard library types only: failures are
// (code, message) pairs in Abseil's canonical codes.
#ifndef ATOLL_SRC_TEXT_SENTENCEPIECE_BRIDGE_H_
#define ATOLL_SRC_TEXT_SENTENCEPIECE_BRIDGE_H_

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace atl::text::spm {

struct Result {
  int code = 0;  // 0: ok; else a canonical status code
  std::string message;
  bool ok() const { return code == 0; }
};

class Processor {
 public:
  Processor();
  ~Processor();
  Result Load(const std::string& path);
  int size() const;
  int bos_id() const;
  int eos_id() const;
  int unk_id() const;
  bool IsControl(int id) const;
  bool IsUnknown(int id) const;
  bool IsUnused(int id) const;
  bool IsByte(int id) const;
  std::string Piece(int id) const;
  Result Encode(std::string_view text, std::vector<int>* ids) const;
  Result Decode(const std::vector<int>& ids, std::string* text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// SentencePiece's trainer with its named arguments (model_prefix, vocab_size, ...).
Result Train(const std::unordered_map<std::string, std::string>& args);

}  // namespace atl::text::spm

#endif  // ATOLL_SRC_TEXT_SENTENCEPIECE_BRIDGE_H_
