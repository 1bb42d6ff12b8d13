#include "src/text/tokenize.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/status_macros.h"
#include "src/text/tokenizer.h"

namespace atl::text {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A unit of work: a piece of one input file, cut at a line end, with the document marks around it.
struct Chunk {
  uint64_t seq = 0;
  std::string text;
  bool first_of_document = false, last_of_document = false;
};

struct Encoded {
  std::vector<uint32_t> tokens;
  int64_t text_bytes = 0;
};

// Where a chunk may end: after the last line end, else (one long line) before a UTF-8 sequence's
// first byte, so no character is cut.
size_t CutPoint(const std::string& buffer) {
  if (auto nl = buffer.rfind('\n'); nl != std::string::npos) return nl + 1;
  size_t at = buffer.size();
  while (at > 0 && (static_cast<unsigned char>(buffer[at - 1]) & 0xC0) == 0x80) --at;
  if (at > 0 && static_cast<unsigned char>(buffer[at - 1]) >= 0xC0) --at;  // a lead byte: keep it
  return at > 0 ? at : buffer.size();
}

// Cuts one file into chunks of about `chunk_bytes` at line ends and hands them on in order.
absl::Status ChunkFile(const std::string& file, size_t chunk_bytes,
                       const std::function<absl::Status(std::string text, bool first, bool last)>& emit) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", file));
  std::string carry;
  for (bool first = true;; first = false) {
    std::string buffer = std::move(carry);
    carry.clear();
    const size_t have = buffer.size();
    buffer.resize(std::max(chunk_bytes, have + 1));
    in.read(buffer.data() + have, std::streamsize(buffer.size() - have));
    buffer.resize(have + size_t(in.gcount()));
    const bool eof = in.eof() || in.gcount() == 0;
    if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", file));
    if (buffer.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(file, " is not text: it holds a NUL byte"));
    }
    if (!eof) {
      const size_t cut = CutPoint(buffer);
      carry = buffer.substr(cut);
      buffer.resize(cut);
    }
    ATL_RETURN_IF_ERROR(emit(std::move(buffer), first, eof));
    if (eof) return absl::OkStatus();
  }
}

// The shards of the output directory, opened as tokens arrive.
class ShardSink {
 public:
  ShardSink(std::string dir, int width, int64_t per_shard, const std::vector<float>& token_bytes)
      : dir_(std::move(dir)), width_(width), per_shard_(per_shard), token_bytes_(token_bytes) {}

  absl::Status Write(const std::vector<uint32_t>& tokens) {
    size_t at = 0;
    while (at < tokens.size()) {
      if (!writer_) {
        const std::string name = absl::StrFormat("shard_%06d.bin", int(shards_.size()));
        ATL_ASSIGN_OR_RETURN(writer_, inner::ShardWriter::Open((fs::path(dir_) / name).string(), width_));
        shards_.push_back({name, 0, 0});
      }
      const size_t n = std::min<size_t>(tokens.size() - at, size_t(per_shard_ - writer_->tokens()));
      ATL_RETURN_IF_ERROR(writer_->Append(tokens.data() + at, n));
      auto& shard = shards_.back();
      shard.tokens += int64_t(n);
      for (size_t i = at; i < at + n; ++i) {
        shard.text_bytes += tokens[i] < token_bytes_.size() ? int64_t(token_bytes_[tokens[i]]) : 0;
      }
      at += n;
      if (writer_->tokens() == per_shard_) ATL_RETURN_IF_ERROR(CloseShard());
    }
    return absl::OkStatus();
  }
  absl::Status CloseShard() {
    if (!writer_) return absl::OkStatus();
    auto closed = writer_->Close();
    writer_.reset();
    return closed;
  }
  std::vector<ShardManifest::Shard>& shards() { return shards_; }

 private:
  std::string dir_;
  int width_;
  int64_t per_shard_;
  const std::vector<float>& token_bytes_;
  std::unique_ptr<inner::ShardWriter> writer_;
  std::vector<ShardManifest::Shard> shards_;
};

// Encodes chunks on a pool of threads; results are taken back in submission order.
class EncodePool {
 public:
  EncodePool(const Tokenizer& tokenizer, int threads, bool marks)
      : tokenizer_(tokenizer), marks_(marks) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }
  ~EncodePool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  void Submit(Chunk chunk) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(chunk));
      ++in_flight_;
    }
    work_cv_.notify_one();
  }
  size_t in_flight() {
    std::lock_guard<std::mutex> lock(mu_);
    return in_flight_;
  }
  // The result of chunk `seq`, waiting for it.
  absl::StatusOr<Encoded> Take(uint64_t seq) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done_.count(seq) > 0; });
    auto result = std::move(done_.at(seq));
    done_.erase(seq);
    --in_flight_;
    return result;
  }

 private:
  void Work() {
    for (;;) {
      Chunk chunk;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_ && queue_.empty()) return;
        chunk = std::move(queue_.front());
        queue_.pop_front();
      }
      absl::StatusOr<Encoded> result = EncodeChunk(chunk);
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.emplace(chunk.seq, std::move(result));
      }
      done_cv_.notify_all();
    }
  }
  absl::StatusOr<Encoded> EncodeChunk(const Chunk& chunk) const {
    Encoded out;
    if (marks_ && chunk.first_of_document && tokenizer_.bos_id() >= 0) {
      out.tokens.push_back(uint32_t(tokenizer_.bos_id()));
    }
    if (!chunk.text.empty()) {
      ATL_ASSIGN_OR_RETURN(auto tokens, tokenizer_.Encode(chunk.text));
      out.tokens.insert(out.tokens.end(), tokens.begin(), tokens.end());
    }
    if (marks_ && chunk.last_of_document && tokenizer_.eos_id() >= 0) {
      out.tokens.push_back(uint32_t(tokenizer_.eos_id()));
    }
    out.text_bytes = int64_t(chunk.text.size());
    return out;
  }

  const Tokenizer& tokenizer_;
  const bool marks_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Chunk> queue_;
  std::map<uint64_t, absl::StatusOr<Encoded>> done_;
  size_t in_flight_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Progress on one line every few seconds: bytes read, rate, tokens, time left.
class Progress {
 public:
  Progress(FILE* out, double every_s, int64_t total_bytes)
      : out_(out), every_s_(every_s), total_(total_bytes), start_(Clock::now()), last_(start_) {}
  void Update(int64_t bytes, int64_t tokens, bool final = false) {
    if (!out_) return;
    const auto now = Clock::now();
    if (!final && std::chrono::duration<double>(now - last_).count() < every_s_) return;
    last_ = now;
    const double s = std::max(1e-9, std::chrono::duration<double>(now - start_).count());
    const double rate = double(bytes) / s;
    const double eta = rate > 0 ? double(total_ - bytes) / rate : 0;
    std::fprintf(out_, "atoll tokenize: %.1f MB of %.1f MB (%.1f%%) | %.2f MB/s | %s tokens | %s\n",
                 bytes / 1e6, total_ / 1e6, total_ > 0 ? 100.0 * bytes / total_ : 100.0, rate / 1e6,
                 absl::StrFormat("%.2fM", tokens / 1e6).c_str(),
                 final ? absl::StrFormat("done in %.1f s", s).c_str()
                       : absl::StrFormat("ETA %.0f s", eta).c_str());
    std::fflush(out_);
  }

 private:
  FILE* out_;
  double every_s_;
  int64_t total_;
  Clock::time_point start_, last_;
};

absl::StatusOr<std::vector<std::string>> InputFiles(const std::vector<std::string>& specs,
                                                    int64_t* total_bytes) {
  if (specs.empty()) return absl::InvalidArgumentError("--input: no text given");
  std::vector<std::string> files;
  *total_bytes = 0;
  for (const auto& spec : specs) {
    auto resolved = inner::ResolveFiles(spec);
    if (!resolved.ok()) {
      return absl::Status(resolved.status().code(), absl::StrCat("--input: ", resolved.status().message()));
    }
    for (auto& f : *resolved) {
      if (absl::EndsWith(f, ".bin")) {
        return absl::InvalidArgumentError(absl::StrCat("--input: ", f, " is a token shard, not text"));
      }
      std::error_code ec;
      *total_bytes += int64_t(fs::file_size(f, ec));
      files.push_back(std::move(f));
    }
  }
  return files;
}

absl::Status PrepareOutput(const std::string& out) {
  if (out.empty()) return absl::InvalidArgumentError("--out is required (a directory for the shards)");
  std::error_code ec;
  if (fs::exists(fs::path(out) / inner::kShardManifest, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat("--out ", out, " already holds token shards (", inner::kShardManifest, "); choose a new directory"));
  }
  fs::create_directories(out, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", out, ": ", ec.message()));
  return absl::OkStatus();
}

int64_t PeakRssBytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return int64_t(usage.ru_maxrss) * 1024;
}

}  // namespace

absl::StatusOr<TokenizeResult> Tokenize(const TokenizeOptions& o) {
  const auto start = Clock::now();
  if (o.shard_tokens < 1 || o.shard_tokens > inner::kMaxShardTokens) {
    return absl::InvalidArgumentError(absl::StrCat("--shard-tokens must be in [1, ", inner::kMaxShardTokens,
                                                   "], got ", o.shard_tokens));
  }
  if (o.chunk_bytes < 16) return absl::InvalidArgumentError("chunk_bytes must be at least 16");
  auto tokenizer = Tokenizer::Load(o.tokenizer);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(), absl::StrCat("--tokenizer: ", tokenizer.status().message()));
  }
  int64_t total_bytes = 0;
  ATL_ASSIGN_OR_RETURN(auto files, InputFiles(o.inputs, &total_bytes));
  ATL_RETURN_IF_ERROR(PrepareOutput(o.out));

  const Tokenizer& tok = **tokenizer;
  const auto token_bytes = tok.TokenBytes();
  const int width = o.token_width > 0 ? o.token_width : inner::ShardWidth(tok.vocab_size());
  if ((width != 2 && width != 4) || width < inner::ShardWidth(tok.vocab_size())) {
    return absl::InvalidArgumentError(absl::StrCat("--token-bytes ", o.token_width, " cannot hold a ",
                                                   tok.vocab_size(), "-token vocabulary (2 or 4; 4 past 65,536)"));
  }
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  ShardSink sink(o.out, width, o.shard_tokens, token_bytes);
  Progress progress(o.progress, o.progress_every_s, total_bytes);
  int64_t bytes_done = 0, tokens_done = 0;
  uint64_t next_seq = 0, next_write = 0;
  absl::Status failed;
  {
    EncodePool pool(tok, threads, o.document_marks);
    // Writes finished chunks in order until at most `keep` are in flight.
    auto drain = [&](size_t keep) -> absl::Status {
      while (next_write < next_seq && pool.in_flight() > keep) {
        ATL_ASSIGN_OR_RETURN(auto encoded, pool.Take(next_write));
        ++next_write;
        ATL_RETURN_IF_ERROR(sink.Write(encoded.tokens));
        bytes_done += encoded.text_bytes;
        tokens_done += int64_t(encoded.tokens.size());
        progress.Update(bytes_done, tokens_done);
      }
      return absl::OkStatus();
    };
    const size_t max_in_flight = size_t(2 * threads);
    for (const auto& file : files) {
      failed = ChunkFile(file, o.chunk_bytes, [&](std::string text, bool first, bool last) {
        pool.Submit(Chunk{next_seq++, std::move(text), first, last});
        return drain(max_in_flight - 1);
      });
      if (!failed.ok()) break;
    }
    if (failed.ok()) failed = drain(0);
  }
  ATL_RETURN_IF_ERROR(failed);
  ATL_RETURN_IF_ERROR(sink.CloseShard());

  TokenizeResult result;
  auto& m = result.manifest;
  m.tokenizer_path = tok.path();
  m.tokenizer_hash = tok.hash();
  m.vocab_size = tok.vocab_size();
  m.token_width = width;
  m.shards = std::move(sink.shards());
  m.inputs = files;
  m.input_bytes = total_bytes;
  ATL_RETURN_IF_ERROR(WriteManifest(o.out, m));
  progress.Update(bytes_done, tokens_done, /*final=*/true);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.threads = threads;
  result.peak_rss_bytes = PeakRssBytes();
  return result;
}

}  // namespace atl::text
