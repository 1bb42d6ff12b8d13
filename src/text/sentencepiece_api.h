// The table of functions the SentencePiece module (sentencepiece_module.cc, built as its own
// shared object) gives atoll. Why a module: Debian's libsentencepiece carries its own copy of
// protobuf-lite under protobuf's symbol names, and linked into a process beside libprotobuf (which
// libtorch and gRPC load) the two bind to each other's symbols and crash at start-up. The module is
// opened with RTLD_LOCAL | RTLD_DEEPBIND, so each copy binds to itself. Standard library types only:
// SentencePiece's headers also clash with Abseil's.
#ifndef ATOLL_SRC_TEXT_SENTENCEPIECE_API_H_
#define ATOLL_SRC_TEXT_SENTENCEPIECE_API_H_

#include <cstddef>
#include <string>
#include <unordered_map>
#include <vector>

namespace atl::text::spm {

inline constexpr int kApiVersion = 1;
inline constexpr const char* kApiSymbol = "atoll_sentencepiece_api";

// Piece kinds, as bits.
inline constexpr int kControl = 1, kUnknown = 2, kUnused = 4, kByte = 8;

// Failures return a canonical status code (0: ok) and fill `message`.
struct Api {
  int version;
  void* (*load)(const char* path, int* code, std::string* message);
  void (*release)(void* processor);
  int (*size)(const void* processor);
  int (*bos_id)(const void* processor);
  int (*eos_id)(const void* processor);
  int (*unk_id)(const void* processor);
  int (*kind)(const void* processor, int id);
  void (*piece)(const void* processor, int id, std::string* out);
  int (*encode)(const void* processor, const char* text, size_t n, std::vector<int>* ids,
                std::string* message);
  int (*decode)(const void* processor, const std::vector<int>* ids, std::string* text,
                std::string* message);
  int (*train)(const std::unordered_map<std::string, std::string>* args, std::string* message);
};

}  // namespace atl::text::spm

#endif  // ATOLL_SRC_TEXT_SENTENCEPIECE_API_H_
