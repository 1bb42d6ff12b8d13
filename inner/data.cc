#include "inner/data.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"

namespace atl::inner {
namespace {

namespace fs = std::filesystem;

class OwnedSegment final : public TokenSegment {
 public:
  OwnedSegment(std::vector<uint16_t> tokens, std::string source)
      : tokens_(std::move(tokens)), source_(std::move(source)) {
    Set(tokens_.data(), tokens_.size(), 2);
  }
  const std::string& source() const override { return source_; }

 private:
  std::vector<uint16_t> tokens_;
  std::string source_;
};

// A shard's token region, mapped read-only; shards can be far larger than memory.
class MappedSegment final : public TokenSegment {
 public:
  MappedSegment(void* base, size_t bytes, size_t tokens, int width, std::string source)
      : base_(base), bytes_(bytes), source_(std::move(source)) {
    Set(static_cast<const char*>(base_) + kShardHeaderBytes, tokens, width);
  }
  ~MappedSegment() override { munmap(base_, bytes_); }
  const std::string& source() const override { return source_; }

 private:
  void* base_;
  size_t bytes_;
  std::string source_;
};

// The largest token of a segment and where it is.
std::pair<uint32_t, size_t> LargestToken(const TokenSegment& s) {
  std::pair<uint32_t, size_t> worst{0, 0};
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] > worst.first) worst = {s[i], i};
  }
  return worst;
}

absl::StatusOr<std::unique_ptr<TokenSegment>> MapShard(const std::string& path, int vocab) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open shard ", path, ": ", strerror(errno)));
  }
  struct stat st;
  fstat(fd, &st);
  const size_t bytes = size_t(st.st_size);
  if (bytes < kShardHeaderBytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shard ", path, " is ", bytes,
                                                   " bytes, shorter than its 1024-byte header"));
  }
  void* base = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot map shard ", path, ": ", strerror(errno)));
  }
  int32_t header[256];
  std::memcpy(header, base, sizeof(header));
  auto fail = [&](std::string message) {
    munmap(base, bytes);
    return absl::InvalidArgumentError(absl::StrCat("shard ", path, ": ", message));
  };
  if (header[0] != kShardMagic && header[0] != kShardMagic32) {
    return fail(absl::StrCat("bad magic ", header[0], " (expected ", kShardMagic, " for uint16 or ",
                             kShardMagic32, " for uint32 tokens)"));
  }
  const int width = header[0] == kShardMagic ? 2 : 4;
  const int32_t version = width == 2 ? kShardVersion : kShardVersion32;
  if (header[1] != version) {
    return fail(absl::StrCat("unsupported version ", header[1], " (expected ", version, ")"));
  }
  if (header[2] < 0 || kShardHeaderBytes + size_t(width) * size_t(header[2]) != bytes) {
    return fail(absl::StrCat("header says ", header[2], " tokens but the file holds ",
                             double(bytes - kShardHeaderBytes) / width, " tokens"));
  }
  auto segment = std::make_unique<MappedSegment>(base, bytes, size_t(header[2]), width, path);
  const auto [worst, at] = LargestToken(*segment);
  if (segment->size() > 0 && int64_t(worst) >= vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", path, ": token ", worst, " at position ", at,
                     " is outside the vocabulary (model.vocab = ", vocab, ")"));
  }
  return segment;
}

absl::Status AppendText(const std::string& path, std::vector<uint16_t>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open text file ", path));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  if (auto nul = bytes.find('\0'); nul != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is not text: NUL byte at offset ", nul,
        " (token shards must end in .bin)"));
  }
  out->reserve(out->size() + bytes.size());
  for (unsigned char c : bytes) out->push_back(c);
  return absl::OkStatus();
}

}  // namespace

std::string RelativePathNote(const std::string& path, const std::string& key) {
  if (path.empty() || fs::path(path).is_absolute()) return "";
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  return absl::StrCat(", relative to the working directory ", cwd.string(),
                      " (relative paths in a config are read from the working directory: run "
                      "where they point, e.g. the repository root for deploy/configs/, or give ",
                      key, " as an absolute path)");
}

std::string NotFoundNote(const absl::Status& status, const std::string& path, const std::string& key) {
  return absl::IsNotFound(status) ? RelativePathNote(path, key) : "";
}

absl::StatusOr<std::vector<std::string>> ResolveFiles(const std::string& spec) {
  std::vector<std::string> files;
  std::error_code ec;
  if (spec.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    const int rc = glob(spec.c_str(), 0, nullptr, &g);
    if (rc == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        if (fs::is_regular_file(g.gl_pathv[i], ec)) files.emplace_back(g.gl_pathv[i]);
      }
    }
    globfree(&g);
    if (files.empty()) return absl::NotFoundError(absl::StrCat("no files match '", spec, "'"));
  } else if (fs::is_directory(spec, ec)) {
    for (const auto& entry : fs::directory_iterator(spec, ec)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_regular_file() && !absl::StartsWith(name, ".") && name != kShardManifest) {
        files.push_back(entry.path().string());
      }
    }
    if (files.empty()) return absl::NotFoundError(absl::StrCat("directory ", spec, " has no files"));
  } else if (fs::is_regular_file(spec, ec)) {
    files.push_back(spec);
  } else {
    return absl::NotFoundError(absl::StrCat("no such file or directory: ", spec));
  }
  std::sort(files.begin(), files.end());
  return files;
}

absl::StatusOr<std::unique_ptr<ShardWriter>> ShardWriter::Open(const std::string& path,
                                                                int width) {
  if (width != 2 && width != 4) {
    return absl::InvalidArgumentError(absl::StrCat("shard width must be 2 or 4 bytes, got ", width));
  }
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create shard ", path, ": ", strerror(errno)));
  }
  auto writer = std::unique_ptr<ShardWriter>(new ShardWriter(path, fd, width));
  writer->buffer_.assign(kShardHeaderBytes, 0);  // the header, rewritten by Close
  return writer;
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) close(fd_);
}

namespace {
absl::Status WriteAll(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return absl::DataLossError(absl::StrCat("cannot write shard ", path, ": ", strerror(errno)));
    data += w;
    n -= size_t(w);
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status ShardWriter::Append(const uint32_t* tokens, size_t n) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("shard ", path_, " is closed"));
  if (count_ + int64_t(n) > kMaxShardTokens) {
    return absl::OutOfRangeError(absl::StrCat("shard ", path_, " would exceed ", kMaxShardTokens, " tokens"));
  }
  const size_t at = buffer_.size();
  buffer_.resize(at + n * size_t(width_));
  if (width_ == 4) {
    std::memcpy(buffer_.data() + at, tokens, n * 4);
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (tokens[i] > 0xFFFF) {
        buffer_.resize(at);  // nothing of this call stays
        return absl::InvalidArgumentError(absl::StrCat(
            "token ", tokens[i], " does not fit a uint16 shard (", path_, "); use 4-byte tokens"));
      }
      const uint16_t t = uint16_t(tokens[i]);
      std::memcpy(buffer_.data() + at + 2 * i, &t, 2);
    }
  }
  count_ += int64_t(n);
  if (buffer_.size() >= (1u << 20)) {
    ATL_RETURN_IF_ERROR(WriteAll(fd_, buffer_.data(), buffer_.size(), path_));
    buffer_.clear();
  }
  return absl::OkStatus();
}

absl::Status ShardWriter::Close() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("shard ", path_, " is closed"));
  ATL_RETURN_IF_ERROR(WriteAll(fd_, buffer_.data(), buffer_.size(), path_));
  buffer_.clear();
  int32_t header[256] = {};
  header[0] = width_ == 2 ? kShardMagic : kShardMagic32;
  header[1] = width_ == 2 ? kShardVersion : kShardVersion32;
  header[2] = int32_t(count_);
  const bool ok = pwrite(fd_, header, sizeof(header), 0) == ssize_t(sizeof(header));
  const bool closed = close(fd_) == 0;
  fd_ = -1;
  if (!ok || !closed) return absl::DataLossError(absl::StrCat("cannot finish shard ", path_));
  return absl::OkStatus();
}

absl::Status WriteShard(const std::string& path, const std::vector<uint16_t>& tokens) {
  ATL_ASSIGN_OR_RETURN(auto writer, ShardWriter::Open(path, 2));
  const std::vector<uint32_t> wide(tokens.begin(), tokens.end());
  ATL_RETURN_IF_ERROR(writer->Append(wide.data(), wide.size()));
  return writer->Close();
}

absl::Status WriteShard32(const std::string& path, const std::vector<uint32_t>& tokens) {
  ATL_ASSIGN_OR_RETURN(auto writer, ShardWriter::Open(path, 4));
  ATL_RETURN_IF_ERROR(writer->Append(tokens.data(), tokens.size()));
  return writer->Close();
}

absl::StatusOr<std::shared_ptr<const TokenCorpus>> TokenCorpus::Load(const std::string& spec,
                                                                     int vocab) {
  ATL_ASSIGN_OR_RETURN(auto files, ResolveFiles(spec));
  auto corpus = std::make_shared<TokenCorpus>();
  const bool any_bin = std::any_of(files.begin(), files.end(),
                                   [](const auto& f) { return absl::EndsWith(f, ".bin"); });
  const bool all_bin = std::all_of(files.begin(), files.end(),
                                   [](const auto& f) { return absl::EndsWith(f, ".bin"); });
  if (any_bin && !all_bin) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", spec, "' mixes .bin token shards with text files"));
  }
  corpus->is_text_ = !all_bin;
  if (all_bin) {
    for (const auto& f : files) {
      ATL_ASSIGN_OR_RETURN(auto segment, MapShard(f, vocab));
      corpus->segments_.push_back(std::move(segment));
    }
  } else {
    if (vocab < 256) {
      return absl::InvalidArgumentError(
          absl::StrCat("text data is byte-level and needs model.vocab >= 256, got ", vocab));
    }
    std::vector<uint16_t> tokens;
    for (const auto& f : files) {
      ATL_RETURN_IF_ERROR(AppendText(f, &tokens));
    }
    corpus->segments_.push_back(std::make_unique<OwnedSegment>(std::move(tokens), spec));
  }
  return std::shared_ptr<const TokenCorpus>(std::move(corpus));
}

std::shared_ptr<const TokenCorpus> TokenCorpus::FromText(const std::string& text) {
  auto corpus = std::make_shared<TokenCorpus>();
  std::vector<uint16_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  corpus->segments_.push_back(std::make_unique<OwnedSegment>(std::move(tokens), "<memory>"));
  return corpus;
}

size_t TokenCorpus::num_tokens() const {
  size_t n = 0;
  for (const auto& s : segments_) n += s->size();
  return n;
}

WindowSet::WindowSet(std::shared_ptr<const TokenCorpus> corpus, int context)
    : corpus_(std::move(corpus)), context_(context) {
  first_window_.push_back(0);
  for (const auto& s : corpus_->segments()) {
    const size_t n = s->size() > size_t(context) ? (s->size() - 1) / context : 0;
    first_window_.push_back(first_window_.back() + n);
  }
  end_ = first_window_.back();
}

WindowSet WindowSet::Slice(size_t begin, size_t end) const {
  WindowSet out = *this;
  out.begin_ = begin_ + begin;
  out.end_ = begin_ + std::min(end, size());
  return out;
}

void WindowSet::Fill(size_t i, int64_t* inputs, int64_t* targets) const {
  const size_t w = begin_ + i;
  const size_t seg = std::upper_bound(first_window_.begin(), first_window_.end(), w) -
                     first_window_.begin() - 1;
  const TokenSegment& s = *corpus_->segments()[seg];
  const size_t first = (w - first_window_[seg]) * size_t(context_);
  if (shuffled_) {
    const std::vector<uint32_t> order =
        SeededPermutation(size_t(context_) + 1, shuffle_seed_ ^ (0x9e3779b97f4a7c15ULL * (w + 1)));
    for (int t = 0; t < context_; ++t) {
      inputs[t] = s[first + order[size_t(t)]];
      targets[t] = s[first + order[size_t(t) + 1]];
    }
    return;
  }
  for (int t = 0; t < context_; ++t) {
    inputs[t] = s[first + size_t(t)];
    targets[t] = s[first + size_t(t) + 1];
  }
}

WindowSet WindowSet::ShuffledTokens(uint64_t seed) const {
  WindowSet out = *this;
  out.shuffled_ = true;
  out.shuffle_seed_ = seed;
  return out;
}

double TextBytes(const int64_t* targets, size_t n, const std::vector<float>& bytes) {
  if (bytes.empty()) return double(n);
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    total += size_t(targets[i]) < bytes.size() ? bytes[size_t(targets[i])] : 0.0;
  }
  return total;
}

absl::Status Validate(const DataConfig& c) {
  if (c.path.empty()) return absl::InvalidArgumentError("data.path is required");
  if (c.val_path.empty() && !(c.val_fraction > 0.0 && c.val_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.val_fraction must be in (0, 1) when data.val_path is not set, got ",
                     c.val_fraction));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Dataset>> MakeDataset(std::shared_ptr<const TokenCorpus> train,
                                                           std::shared_ptr<const TokenCorpus> val,
                                                           double val_fraction, int context,
                                                           uint64_t order_seed) {
  WindowSet all(train, context);
  auto too_small = [&](const char* key, size_t tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        key, ": ", tokens, " tokens are too few for windows of model.context = ", context));
  };
  if (val) {
    WindowSet v(val, context);
    if (all.size() == 0) return too_small("data.path", train->num_tokens());
    if (v.size() == 0) return too_small("data.val_path", val->num_tokens());
    return std::make_shared<const Dataset>(Dataset{all, v, order_seed, train->is_text(), {}});
  }
  const size_t n = all.size();
  const size_t n_val = size_t(std::ceil(double(n) * val_fraction));
  if (n < n_val + 2 || n_val == 0) return too_small("data.path", train->num_tokens());
  return std::make_shared<const Dataset>(
      Dataset{all.Slice(0, n - n_val - 1), all.Slice(n - n_val, n), order_seed, train->is_text(), {}});
}

absl::StatusOr<std::shared_ptr<const Dataset>> LoadDataset(const DataConfig& c, int context,
                                                           int vocab,
                                                           std::vector<float> token_bytes) {
  ATL_RETURN_IF_ERROR(Validate(c));
  auto train = TokenCorpus::Load(c.path, vocab);
  if (!train.ok()) {
    return absl::Status(train.status().code(), absl::StrCat("data.path: ", train.status().message(),
                                                            NotFoundNote(train.status(), c.path, "data.path")));
  }
  std::shared_ptr<const TokenCorpus> val;
  if (!c.val_path.empty()) {
    auto v = TokenCorpus::Load(c.val_path, vocab);
    if (!v.ok()) {
      return absl::Status(v.status().code(), absl::StrCat("data.val_path: ", v.status().message(),
                                                          NotFoundNote(v.status(), c.val_path, "data.val_path")));
    }
    val = *v;
  }
  ATL_ASSIGN_OR_RETURN(auto dataset, MakeDataset(*train, val, c.val_fraction, context, c.seed));
  const bool with_bytes = !token_bytes.empty() && !dataset->per_byte;
  if (!with_bytes && !c.shuffle_tokens) return dataset;
  auto out = std::make_shared<Dataset>(*dataset);
  if (with_bytes) out->token_bytes = std::move(token_bytes);
  if (c.shuffle_tokens) out->train = out->train.ShuffledTokens(c.seed);
  return std::shared_ptr<const Dataset>(std::move(out));
}

std::vector<uint32_t> SeededPermutation(size_t n, uint64_t seed) {
  std::vector<uint32_t> perm(n);
  for (size_t i = 0; i < n; ++i) perm[i] = uint32_t(i);
  uint64_t state = seed;
  auto next = [&state] {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  for (size_t i = n; i > 1; --i) {
    const size_t j = size_t((unsigned __int128)next() * i >> 64);
    std::swap(perm[i - 1], perm[j]);
  }
  return perm;
}

BatchSampler::BatchSampler(const WindowSet* windows, uint64_t seed, int stream, int num_streams)
    : windows_(windows),
      seed_(seed),
      stream_(stream),
      num_streams_(num_streams),
      per_stream_(windows->size() / size_t(num_streams)) {}

absl::StatusOr<BatchSampler> BatchSampler::Create(const WindowSet* windows, uint64_t seed,
                                                  int stream, int num_streams) {
  if (num_streams <= 0 || stream < 0 || stream >= num_streams) {
    return absl::InvalidArgumentError(
        absl::StrCat("data stream ", stream, " is not in [0, ", num_streams, ")"));
  }
  if (windows->size() < size_t(num_streams)) {
    return absl::InvalidArgumentError(absl::StrCat("only ", windows->size(),
                                                   " training windows for ", num_streams,
                                                   " data streams (islands x ranks)"));
  }
  return BatchSampler(windows, seed, stream, num_streams);
}

void BatchSampler::EnsurePermutation() {
  if (cursor_.index >= per_stream_) {
    cursor_.epoch += 1;
    cursor_.index = 0;
  }
  if (perm_epoch_ != cursor_.epoch) {
    perm_ = SeededPermutation(windows_->size(), seed_ ^ (0xa0761d6478bd642fULL * (cursor_.epoch + 1)));
    perm_epoch_ = cursor_.epoch;
  }
}

size_t BatchSampler::PeekWindow() {
  EnsurePermutation();
  return perm_[size_t(stream_) + cursor_.index * size_t(num_streams_)];
}

void BatchSampler::Next(int batch, int64_t* inputs, int64_t* targets) {
  NextSlice(batch, 0, batch, inputs, targets);
}

void BatchSampler::NextSlice(int batch, int first, int count, int64_t* inputs, int64_t* targets) {
  const size_t t = size_t(windows_->context());
  for (int b = 0; b < batch; ++b) {
    if (b >= first && b < first + count) {
      windows_->Fill(PeekWindow(), inputs + (b - first) * t, targets + (b - first) * t);
    } else {
      EnsurePermutation();  // the epoch may roll over on a window this rank skips
    }
    cursor_.index += 1;
  }
}

}  // namespace atl::inner
