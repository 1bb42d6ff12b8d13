// Token data for the inner loop: byte-level text and llm.c token shards, cut into fixed windows,
// served in a seeded order with disjoint streams per (island, rank). Torch-free on purpose: the
// trainer wraps the int64 buffers it fills.
#ifndef ATOLL_INNER_DATA_H_
#define ATOLL_INNER_DATA_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace atl::inner {

// llm.c shard formats: 256 int32 header words (magic, version, token count, ...), then the tokens,
// little-endian: uint16 (llm.c's GPT-2 shards) or uint32 (llm.c's Llama 3 shards, for
// vocabularies over 65,536).
inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int32_t kShardMagic32 = 20240801;
inline constexpr int32_t kShardVersion32 = 7;
inline constexpr size_t kShardHeaderBytes = 256 * sizeof(int32_t);
inline constexpr int64_t kMaxShardTokens = INT32_MAX;  // the header's count is an int32
// The name `atoll tokenize` gives its manifest in a directory of shards; TokenCorpus::Load skips it.
inline constexpr const char* kShardManifest = "manifest.json";

// The narrowest shard width for a vocabulary: 2 bytes up to 65,536 tokens, else 4.
inline int ShardWidth(int64_t vocab) { return vocab <= 65536 ? 2 : 4; }

// Writes one shard as it goes (tokens are never all in memory): the header's count is written on
// Close. width 2 or 4; Append refuses tokens the width cannot hold.
class ShardWriter {
 public:
  static absl::StatusOr<std::unique_ptr<ShardWriter>> Open(const std::string& path, int width);
  ~ShardWriter();
  absl::Status Append(const uint32_t* tokens, size_t n);
  absl::Status Close();
  int64_t tokens() const { return count_; }
  int64_t bytes() const { return int64_t(kShardHeaderBytes) + count_ * width_; }

 private:
  ShardWriter(std::string path, int fd, int width) : path_(std::move(path)), fd_(fd), width_(width) {}
  std::string path_;
  int fd_;
  int width_;
  int64_t count_ = 0;
  std::vector<char> buffer_;
};

// Writes a whole shard at once (tests, small data).
absl::Status WriteShard(const std::string& path, const std::vector<uint16_t>& tokens);
absl::Status WriteShard32(const std::string& path, const std::vector<uint32_t>& tokens);

// The files a path spec names: a file, a directory's regular files (not hidden ones, not a shard
// manifest), or a glob's matches; sorted by name.
absl::StatusOr<std::vector<std::string>> ResolveFiles(const std::string& spec);

// For a relative path that names nothing: ", relative to the working directory /w (paths in a
// config are read from the working directory: run where they point, e.g. the repository root for
// deploy/configs/, or give KEY an absolute path)"; "" for an absolute one. `key`: e.g. "data.path".
std::string RelativePathNote(const std::string& path, const std::string& key);
// The same when `status` is NOT_FOUND, else "".
std::string NotFoundNote(const absl::Status& status, const std::string& path, const std::string& key);

// A read-only run of tokens: an mmapped shard or a buffer of text bytes, 2 or 4 bytes a token.
class TokenSegment {
 public:
  virtual ~TokenSegment() = default;
  virtual const std::string& source() const = 0;
  size_t size() const { return size_; }
  int width() const { return width_; }
  uint32_t operator[](size_t i) const {
    return width_ == 2 ? static_cast<const uint16_t*>(tokens_)[i]
                       : static_cast<const uint32_t*>(tokens_)[i];
  }

 protected:
  void Set(const void* tokens, size_t size, int width) {
    tokens_ = tokens;
    size_ = size;
    width_ = width;
  }

 private:
  const void* tokens_ = nullptr;
  size_t size_ = 0;
  int width_ = 2;
};

// The tokens named by a path spec: a text file, a directory (its regular files, sorted by name),
// or a glob. Files ending in ".bin" are llm.c shards (one segment each); all other files are UTF-8
// text read as bytes and concatenated into one segment. A spec may not mix the two kinds.
class TokenCorpus {
 public:
  static absl::StatusOr<std::shared_ptr<const TokenCorpus>> Load(const std::string& spec,
                                                                 int vocab);
  // In-memory corpus (tests, and text already in hand).
  static std::shared_ptr<const TokenCorpus> FromText(const std::string& text);

  const std::vector<std::unique_ptr<TokenSegment>>& segments() const { return segments_; }
  size_t num_tokens() const;
  bool is_text() const { return is_text_; }

 private:
  std::vector<std::unique_ptr<TokenSegment>> segments_;
  bool is_text_ = true;
};

// Fixed windows of context + 1 tokens (inputs and shifted targets) at stride `context`; windows
// never cross a segment boundary. A WindowSet is a range [begin, end) of a corpus' windows.
class WindowSet {
 public:
  WindowSet(std::shared_ptr<const TokenCorpus> corpus, int context);
  WindowSet Slice(size_t begin, size_t end) const;

  size_t size() const { return end_ - begin_; }
  int context() const { return context_; }
  // Copies window i (relative to this set) into inputs[context] and targets[context].
  void Fill(size_t i, int64_t* inputs, int64_t* targets) const;
  // The same windows, each one's tokens in an order drawn from `seed` and the window (a rehearsed
  // broken island's garbage: data.shuffle_tokens).
  WindowSet ShuffledTokens(uint64_t seed) const;

 private:
  std::shared_ptr<const TokenCorpus> corpus_;
  int context_;
  bool shuffled_ = false;
  uint64_t shuffle_seed_ = 0;
  std::vector<size_t> first_window_;  // prefix sums of windows per segment (size = segments + 1)
  size_t begin_ = 0, end_ = 0;
};

// The train and validation windows of a run. Validation comes from data.val_path when given, else
// from the last val_fraction of the corpus' windows (one window is skipped between the two so no
// token is shared).
struct Dataset {
  WindowSet train;
  WindowSet val;
  uint64_t order_seed = 0;  // seeds the permutation of training windows
  bool per_byte = true;     // tokens are bytes (text), so bits per token are bits per byte
  // Token shards: each token's length in bytes of text (from the tokenizer that made them), so
  // validation reports bits per byte too; empty when unknown.
  std::vector<float> token_bytes;
};

// The [data] section.
struct DataConfig {
  static constexpr const char* kSection = "data";
  std::string path;         // text file, directory or glob
  std::string val_path;     // optional separate validation data
  double val_fraction = 0.05;
  uint64_t seed = 1234;     // order of training windows
  std::string tokenizer;    // the SentencePiece model the shards were made with (src/text/)
  bool shuffle_tokens = false;  // a rehearsed broken island: it trains on shuffled windows
};

template <class V>
void VisitKeys(DataConfig& c, V&& v) {
  v("path", c.path, "text file, directory of text files, or glob of .bin shards");
  v("val_path", c.val_path, "separate validation data (same forms as data.path)");
  v("val_fraction", c.val_fraction, "held-out tail when data.val_path is unset");
  v("seed", c.seed, "seed of the training-window order");
  v("tokenizer", c.tokenizer,
    "SentencePiece model (tokenizer.model) the .bin shards were made with: checked against their "
    "manifest; gives bits per byte and `atoll generate` its text");
  v("shuffle_tokens", c.shuffle_tokens,
    "rehearse a broken island: each training window's tokens shuffled (garbage to train on)");
}

absl::Status Validate(const DataConfig& config);
// token_bytes: Dataset::token_bytes for token shards (src/text/ reads them from the tokenizer).
absl::StatusOr<std::shared_ptr<const Dataset>> LoadDataset(const DataConfig& config, int context,
                                                           int vocab,
                                                           std::vector<float> token_bytes = {});
// Same split rule over a corpus already in memory.
absl::StatusOr<std::shared_ptr<const Dataset>> MakeDataset(std::shared_ptr<const TokenCorpus> train,
                                                           std::shared_ptr<const TokenCorpus> val,
                                                           double val_fraction, int context,
                                                           uint64_t order_seed);

// Position of a stream in its data: epochs are seeded permutations of all training windows; stream
// s of S takes permutation positions s, s + S, s + 2S, ... (each epoch equally long per stream).
struct DataCursor {
  uint64_t epoch = 0;
  uint64_t index = 0;  // windows already taken from this stream in this epoch
  bool operator==(const DataCursor& o) const { return epoch == o.epoch && index == o.index; }
};

class BatchSampler {
 public:
  // stream in [0, num_streams); the stream of (island i, rank r) is i * ranks + r.
  static absl::StatusOr<BatchSampler> Create(const WindowSet* windows, uint64_t seed, int stream,
                                             int num_streams);

  // Fills `batch` windows: inputs and targets are [batch, context] row-major.
  void Next(int batch, int64_t* inputs, int64_t* targets);
  // Takes `batch` windows from the stream but fills only [first, first + count) of them: the
  // share of one rank of an island whose data-parallel ranks split each global batch.
  void NextSlice(int batch, int first, int count, int64_t* inputs, int64_t* targets);
  // Index (into the WindowSet) of the next window this stream would serve.
  size_t PeekWindow();

  const DataCursor& cursor() const { return cursor_; }
  void set_cursor(const DataCursor& cursor) { cursor_ = cursor; }
  size_t windows_per_epoch() const { return per_stream_; }

 private:
  BatchSampler(const WindowSet* windows, uint64_t seed, int stream, int num_streams);
  void EnsurePermutation();

  const WindowSet* windows_;
  uint64_t seed_;
  int stream_, num_streams_;
  size_t per_stream_;
  DataCursor cursor_;
  uint64_t perm_epoch_ = UINT64_MAX;
  std::vector<uint32_t> perm_;
};

// The bytes of text that n target tokens stand for, with bytes[token] the length of each token's
// text (empty: one byte per token).
double TextBytes(const int64_t* targets, size_t n, const std::vector<float>& bytes);

// Seeded Fisher-Yates permutation of [0, n), identical on every platform and standard library.
std::vector<uint32_t> SeededPermutation(size_t n, uint64_t seed);

}  // namespace atl::inner

#endif  // ATOLL_INNER_DATA_H_
