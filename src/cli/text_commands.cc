#include "src/cli/text_commands.h"

#include <chrono>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "compression/status_macros.h"

namespace atl {

absl::Status RunTokenizerTrain(const text::TrainOptions& o, FILE* out) {
  const auto start = std::chrono::steady_clock::now();
  ATL_RETURN_IF_ERROR(text::TrainTokenizer(o));
  ATL_ASSIGN_OR_RETURN(auto tokenizer, text::Tokenizer::Load(o.out));
  std::fprintf(out,
               "atoll tokenizer train: %s (%s, %d tokens, xxh64 %s) from %zu file(s) in %.1f s\n"
               "  next: atoll tokenize --tokenizer %s --input FILES --out DIR\n",
               tokenizer->path().c_str(), o.model_type.c_str(), tokenizer->vocab_size(),
               tokenizer->hash().c_str(), o.inputs.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
               o.out.c_str());
  return absl::OkStatus();
}

absl::Status RunTokenize(const text::TokenizeOptions& o, FILE* out) {
  ATL_ASSIGN_OR_RETURN(auto r, text::Tokenize(o));
  const auto& m = r.manifest;
  const int64_t tokens = m.tokens();
  std::fprintf(out,
               "atoll tokenize: %zu file(s), %.1f MB -> %lld tokens (%.2f bytes/token) in %zu "
               "shard(s) of uint%d in %s\n"
               "  %.2f MB/s on %d thread(s), %.1f s; peak RSS %.1f MiB\n"
               "  train on them: data.path = \"%s\" (or data.val_path, for a validation set), "
               "data.tokenizer = \"%s\", model.vocab = %lld\n",
               m.inputs.size(), m.input_bytes / 1e6, (long long)tokens,
               tokens > 0 ? double(m.input_bytes) / double(tokens) : 0.0, m.shards.size(),
               8 * m.token_width, o.out.c_str(), r.seconds > 0 ? m.input_bytes / 1e6 / r.seconds : 0.0,
               r.threads, r.seconds, r.peak_rss_bytes / 1048576.0,
               std::filesystem::absolute(o.out).lexically_normal().c_str(), m.tokenizer_path.c_str(),
               (long long)m.vocab_size);
  return absl::OkStatus();
}

}  // namespace atl
