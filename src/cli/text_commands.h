// `atoll tokenizer train` and `atoll tokenize`: a SentencePiece tokenizer trained on text, and text
// turned into token shards a run reads (src/text/).
#ifndef ATOLL_SRC_CLI_TEXT_COMMANDS_H_
#define ATOLL_SRC_CLI_TEXT_COMMANDS_H_

#include <cstdio>

#include "absl/status/status.h"
#include "src/text/token_shards.h"
#include "src/text/tokenize.h"
#include "src/text/tokenizer.h"

namespace atl {

absl::Status RunTokenizerTrain(const text::TrainOptions& options, FILE* out = stdout);
// Prints what was written: shards, tokens, bytes per token, rate, threads and peak memory.
absl::Status RunTokenize(const text::TokenizeOptions& options, FILE* out = stdout);

}  // namespace atl

#endif  // ATOLL_SRC_CLI_TEXT_COMMANDS_H_
