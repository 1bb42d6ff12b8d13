#include "src/text/tokenizer.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "compression/checksum.h"
#include "compression/status_macros.h"
#include "src/text/sentencepiece_bridge.h"

namespace atl::text {
namespace {

namespace fs = std::filesystem;

absl::Status FromSentencePiece(const spm::Result& r, const std::string& what) {
  if (r.ok()) return absl::OkStatus();
  return absl::Status(absl::StatusCode(r.code), absl::StrCat(what, ": ", r.message));
}

// The UTF-8 bytes of U+2581, SentencePiece's word-boundary mark (it stands for one space).
constexpr std::string_view kSpaceMark = "\xe2\x96\x81";

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<spm::Processor> processor, std::string path, std::string hash)
    : processor_(std::move(processor)), path_(std::move(path)), hash_(std::move(hash)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::string> FileHash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  compression::Hasher hasher;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), std::streamsize(buffer.size()));
    hasher.Update(buffer.data(), size_t(in.gcount()));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return absl::StrFormat("%016x", hasher.Digest());
}

absl::StatusOr<std::unique_ptr<const Tokenizer>> Tokenizer::Load(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat("no tokenizer file ", path));
  }
  auto processor = std::make_unique<spm::Processor>();
  const auto loaded = processor->Load(path);
  if (!loaded.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is not a SentencePiece model (tokenizer.model): ", loaded.message));
  }
  ATL_ASSIGN_OR_RETURN(auto hash, FileHash(path));
  return std::unique_ptr<const Tokenizer>(
      new Tokenizer(std::move(processor), fs::absolute(path).lexically_normal().string(), std::move(hash)));
}

int Tokenizer::vocab_size() const { return processor_->size(); }
int Tokenizer::bos_id() const { return processor_->bos_id(); }
int Tokenizer::eos_id() const { return processor_->eos_id(); }
int Tokenizer::unk_id() const { return processor_->unk_id(); }

absl::StatusOr<std::vector<uint32_t>> Tokenizer::Encode(std::string_view text) const {
  std::vector<int> ids;
  ATL_RETURN_IF_ERROR(FromSentencePiece(processor_->Encode(text, &ids), "tokenizing"));
  return std::vector<uint32_t>(ids.begin(), ids.end());
}

absl::StatusOr<std::string> Tokenizer::Decode(const std::vector<uint32_t>& ids) const {
  std::vector<int> in;
  in.reserve(ids.size());
  for (uint32_t id : ids) {
    if (id >= uint32_t(vocab_size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", id, " is outside the tokenizer's vocabulary of ", vocab_size()));
    }
    in.push_back(int(id));
  }
  std::string text;
  ATL_RETURN_IF_ERROR(FromSentencePiece(processor_->Decode(in, &text), "decoding"));
  return text;
}

std::string Tokenizer::TokenText(uint32_t id) const {
  const auto& p = *processor_;
  const int i = int(id);
  if (id >= uint32_t(vocab_size()) || p.IsControl(i) || p.IsUnknown(i) || p.IsUnused(i)) return {};
  const std::string piece = p.Piece(i);
  if (p.IsByte(i)) {  // "<0xAB>"
    return std::string(1, char(std::strtol(piece.substr(3, 2).c_str(), nullptr, 16)));
  }
  std::string text;
  for (size_t at = 0; at < piece.size();) {
    if (piece.compare(at, kSpaceMark.size(), kSpaceMark) == 0) {
      text += ' ';
      at += kSpaceMark.size();
    } else {
      text += piece[at++];
    }
  }
  return text;
}

std::vector<float> Tokenizer::TokenBytes() const {
  std::vector<float> bytes(static_cast<size_t>(vocab_size()));
  for (size_t id = 0; id < bytes.size(); ++id) bytes[id] = float(TokenText(uint32_t(id)).size());
  return bytes;
}

absl::Status TrainTokenizer(const TrainOptions& o) {
  if (o.inputs.empty()) return absl::InvalidArgumentError("--input: no text files given");
  for (const auto& f : o.inputs) {
    std::error_code ec;
    if (!fs::is_regular_file(f, ec)) return absl::NotFoundError(absl::StrCat("--input: no such file ", f));
  }
  if (o.out.empty()) return absl::InvalidArgumentError("--out is required (the model file to write)");
  if (o.model_type != "bpe" && o.model_type != "unigram") {
    return absl::InvalidArgumentError(
        absl::StrCat("--model-type must be bpe or unigram, got '", o.model_type, "'"));
  }
  if (o.vocab_size < 260 || o.vocab_size > 1'000'000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--vocab-size must be in [260, 1000000] (256 byte tokens and 4 special ones at least), got ",
        o.vocab_size));
  }
  std::error_code ec;
  if (const auto dir = fs::path(o.out).parent_path(); !dir.empty()) fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create the directory of ", o.out, ": ", ec.message()));
  std::string prefix = o.out;
  if (fs::path(prefix).extension() == ".model") prefix = (fs::path(prefix).parent_path() / fs::path(prefix).stem()).string();
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  const std::unordered_map<std::string, std::string> args = {
      {"input", absl::StrJoin(o.inputs, ",")},
      {"model_prefix", prefix},
      {"model_type", o.model_type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},
      // Text as it is: no normalization, spaces kept (so decoding gives the text back), and no
      // space added at the start of each input (chunks of a corpus concatenate exactly).
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"input_sentence_size", std::to_string(o.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(threads)},
      {"minloglevel", "1"},
      {"unk_id", "0"}, {"bos_id", "1"}, {"eos_id", "2"}, {"pad_id", "-1"},
  };
  ATL_RETURN_IF_ERROR(FromSentencePiece(spm::Train(args),
                                        "SentencePiece training"));
  // The trainer writes PREFIX.model and PREFIX.vocab.
  const std::string written = prefix + ".model";
  if (written != o.out) {
    fs::rename(written, o.out, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot move ", written, " to ", o.out, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace atl::text
