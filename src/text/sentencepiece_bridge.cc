#include "src/text/sentencepiece_bridge.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "src/text/sentencepiece_api.h"

namespace atl::text::spm {
namespace {

namespace fs = std::filesystem;
constexpr int kFailedPrecondition = 9, kInvalidArgument = 3;

// Where the module may be: $ATOLL_SENTENCEPIECE_MODULE, beside the executable, its ../lib/atoll/,
// then where this build put it.
std::vector<std::string> Candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("ATOLL_SENTENCEPIECE_MODULE"); env && *env) out.emplace_back(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / ATOLL_SENTENCEPIECE_MODULE_NAME).string());
    out.push_back((exe.parent_path() / ".." / "lib" / "atoll" / ATOLL_SENTENCEPIECE_MODULE_NAME).string());
  }
  out.emplace_back(ATOLL_SENTENCEPIECE_MODULE_PATH);
  return out;
}

struct Loaded {
  const Api* api = nullptr;
  std::string error;
};

const Loaded& Module() {
  static const Loaded loaded = [] {
    Loaded l;
    std::string tried;
    for (const auto& path : Candidates()) {
      std::error_code ec;
      if (!fs::exists(path, ec)) {
        tried += (tried.empty() ? "" : ", ") + path;
        continue;
      }
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (!handle) {
        l.error = std::string("cannot load the SentencePiece module ") + path + ": " + dlerror();
        return l;
      }
      auto* get = reinterpret_cast<const Api* (*)()>(dlsym(handle, kApiSymbol));
      if (!get || get()->version != kApiVersion) {
        l.error = path + " is not atoll's SentencePiece module of this version";
        return l;
      }
      l.api = get();
      return l;
    }
    l.error = "the SentencePiece module " + std::string(ATOLL_SENTENCEPIECE_MODULE_NAME) +
              " is not installed (looked in " + tried + "; set ATOLL_SENTENCEPIECE_MODULE)";
    return l;
  }();
  return loaded;
}

Result Unavailable() { return {kFailedPrecondition, Module().error}; }

}  // namespace

struct Processor::Impl {
  void* handle = nullptr;
  ~Impl() {
    if (handle) Module().api->release(handle);
  }
};

Processor::Processor() : impl_(std::make_unique<Impl>()) {}
Processor::~Processor() = default;

Result Processor::Load(const std::string& path) {
  const Api* api = Module().api;
  if (!api) return Unavailable();
  Result r;
  void* handle = api->load(path.c_str(), &r.code, &r.message);
  if (!handle) {
    if (r.code == 0) r.code = kInvalidArgument;
    return r;
  }
  if (impl_->handle) api->release(impl_->handle);
  impl_->handle = handle;
  return {};
}

// The accessors below are called on a loaded processor only (Tokenizer::Load checks).
int Processor::size() const { return Module().api->size(impl_->handle); }
int Processor::bos_id() const { return Module().api->bos_id(impl_->handle); }
int Processor::eos_id() const { return Module().api->eos_id(impl_->handle); }
int Processor::unk_id() const { return Module().api->unk_id(impl_->handle); }
bool Processor::IsControl(int id) const { return Module().api->kind(impl_->handle, id) & kControl; }
bool Processor::IsUnknown(int id) const { return Module().api->kind(impl_->handle, id) & kUnknown; }
bool Processor::IsUnused(int id) const { return Module().api->kind(impl_->handle, id) & kUnused; }
bool Processor::IsByte(int id) const { return Module().api->kind(impl_->handle, id) & kByte; }

std::string Processor::Piece(int id) const {
  std::string out;
  Module().api->piece(impl_->handle, id, &out);
  return out;
}

Result Processor::Encode(std::string_view text, std::vector<int>* ids) const {
  Result r;
  r.code = Module().api->encode(impl_->handle, text.data(), text.size(), ids, &r.message);
  return r;
}

Result Processor::Decode(const std::vector<int>& ids, std::string* text) const {
  Result r;
  r.code = Module().api->decode(impl_->handle, &ids, text, &r.message);
  return r;
}

Result Train(const std::unordered_map<std::string, std::string>& args) {
  const Api* api = Module().api;
  if (!api) return Unavailable();
  Result r;
  r.code = api->train(&args, &r.message);
  return r;
}

}  // namespace atl::text::spm
