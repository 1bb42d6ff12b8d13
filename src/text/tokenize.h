// `atoll tokenize`: text through a tokenizer into token shards and their manifest, streaming, on
// every core.
#ifndef ATOLL_SRC_TEXT_TOKENIZE_H_
#define ATOLL_SRC_TEXT_TOKENIZE_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/text/token_shards.h"

namespace atl::text {

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

}  // namespace atl::text

#endif  // ATOLL_SRC_TEXT_TOKENIZE_H_
