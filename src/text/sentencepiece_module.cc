// The SentencePiece module (see sentencepiece_api.h). No Abseil header may come into this file.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "src/text/sentencepiece_api.h"

namespace {

using Processor = sentencepiece::SentencePieceProcessor;

int Code(const sentencepiece::util::Status& s, std::string* message) {
  if (s.ok()) return 0;
  *message = s.message();
  return int(s.code());
}

const Processor& P(const void* p) { return *static_cast<const Processor*>(p); }

void* Load(const char* path, int* code, std::string* message) {
  auto* p = new Processor();
  *code = Code(p->Load(path), message);
  if (*code == 0) return p;
  delete p;
  return nullptr;
}

void Release(void* p) { delete static_cast<Processor*>(p); }
int Size(const void* p) { return P(p).GetPieceSize(); }
int Bos(const void* p) { return P(p).bos_id(); }
int Eos(const void* p) { return P(p).eos_id(); }
int Unk(const void* p) { return P(p).unk_id(); }

int Kind(const void* p, int id) {
  const Processor& s = P(p);
  using namespace atl::text::spm;
  return (s.IsControl(id) ? kControl : 0) | (s.IsUnknown(id) ? kUnknown : 0) |
         (s.IsUnused(id) ? kUnused : 0) | (s.IsByte(id) ? kByte : 0);
}

void Piece(const void* p, int id, std::string* out) { *out = P(p).IdToPiece(id); }

int Encode(const void* p, const char* text, size_t n, std::vector<int>* ids, std::string* message) {
  return Code(P(p).Encode(std::string_view(text, n), ids), message);
}

int Decode(const void* p, const std::vector<int>* ids, std::string* text, std::string* message) {
  return Code(P(p).Decode(*ids, text), message);
}

int Train(const std::unordered_map<std::string, std::string>* args, std::string* message) {
  return Code(sentencepiece::SentencePieceTrainer::Train(*args), message);
}

const atl::text::spm::Api kApi = {atl::text::spm::kApiVersion, Load, Release, Size, Bos, Eos, Unk, Kind,
                                  Piece, Encode, Decode, Train};

}  // namespace

extern "C" __attribute__((visibility("default"))) const atl::text::spm::Api* atoll_sentencepiece_api() {
  return &kApi;
}
