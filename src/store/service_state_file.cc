#include "src/store/service_state_file.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compression/checksum.h"
#include "compression/status_macros.h"
#include "src/store/atomic_file.h"

namespace atl {
namespace {

namespace pb = ::atollpb::v1;
constexpr char kMagic1[8] = {'A', 'T', 'O', 'L', 'L', 'S', 'V', '1'};
constexpr char kMagic2[8] = {'A', 'T', 'O', 'L', 'L', 'S', 'V', '2'};
constexpr char kMagic3[8] = {'A', 'T', 'O', 'L', 'L', 'S', 'V', '3'};
constexpr const char* kParams = outer::SyncServer::kParamsTensor;
constexpr uint64_t kTail = 24;  // footer length, footer hash, magic

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(char((v >> (8 * i)) & 0xFF));
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
  return v;
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

// Formats 1 and 2 held the "nesterov" optimizer's tensors in fixed fields: the same state as
// format 3 describes it (its tensors that have elements, the counter beside the buffer).
void DescribeAsFormat3(pb::FragmentState& fs) {
  fs.set_optimizer("nesterov");
  auto add = [&](const char* name, uint64_t n, uint64_t hash) {
    if (n == 0) return;
    auto* t = fs.add_optimizer_tensors();
    t->set_name(name);
    t->set_num_elements(n);
    t->set_hash(hash);
  };
  add("momentum", fs.momentum_elements(), fs.momentum_hash());
  add("buffer", fs.buffer_elements(), fs.buffer_hash());
  if (fs.buffer_elements() > 0) {
    auto* c = fs.add_optimizer_counters();
    c->set_name("buffered");
    c->set_value(fs.buffered());
  }
}

// An open state file: its description (as format 3 gives it) and where each tensor lies.
class StateFile {
 public:
  static absl::StatusOr<StateFile> Open(const std::string& path);

  const pb::ServiceState& description() const { return description_; }
  // Reads tensor `name` of `fragment` (n elements, as the description says) into out.
  absl::Status Read(uint32_t fragment, const std::string& name, float* out, size_t n) const;

 private:
  absl::Status OpenFormat1(std::string file);
  absl::Status OpenSections(uint64_t size, const char* magic);
  absl::Status Error(const std::string& what) const {
    return absl::DataLossError(absl::StrCat(path_, ": ", what));
  }

  std::string path_;
  File file_;
  bool format1_ = false;
  pb::ServiceState description_;
  // Per fragment: each tensor's name, elements and offset in the file (formats 2 and 3).
  struct Located {
    std::string name;
    uint64_t n = 0, offset = 0;
  };
  std::vector<std::vector<Located>> tensors_;
  std::vector<pb::FragmentState> format1_fragments_;  // format 1: the tensors' bytes
};

absl::StatusOr<StateFile> StateFile::Open(const std::string& path) {
  StateFile f;
  f.path_ = path;
  f.file_.reset(std::fopen(path.c_str(), "rb"));
  if (!f.file_) return absl::NotFoundError(absl::StrCat("no service state at ", path));
  char magic[8];
  if (fseeko(f.file_.get(), 0, SEEK_END) != 0) return f.Error("cannot seek");
  const off_t end = ftello(f.file_.get());
  std::rewind(f.file_.get());
  if (end < 16 || std::fread(magic, 1, 8, f.file_.get()) != 8) {
    return f.Error("not an atoll service state (too short)");
  }
  for (const char* sectioned : {kMagic3, kMagic2}) {
    if (std::memcmp(magic, sectioned, 8) == 0) {
      ATL_RETURN_IF_ERROR(f.OpenSections(uint64_t(end), sectioned));
      return f;
    }
  }
  if (std::memcmp(magic, kMagic1, 8) != 0) return f.Error("not an atoll service state (bad magic)");
  std::string file(size_t(end), '\0');
  std::rewind(f.file_.get());
  if (std::fread(file.data(), 1, file.size(), f.file_.get()) != file.size()) {
    return f.Error("cannot read the file");
  }
  ATL_RETURN_IF_ERROR(f.OpenFormat1(std::move(file)));
  return f;
}

absl::Status StateFile::OpenFormat1(std::string file) {
  if (compression::Checksum(file.data() + 16, file.size() - 16) != GetU64(file.data() + 8)) {
    return Error("checksum mismatch (truncated or corrupted)");
  }
  if (!description_.ParseFromArray(file.data() + 16, int(file.size() - 16))) {
    return Error("cannot parse the service state");
  }
  // The tensors are in the message: describe them as format 3 does, keep their bytes aside.
  for (auto& fs : *description_.mutable_fragments()) {
    for (const std::string* bytes : {&fs.params(), &fs.momentum(), &fs.momentum_buffer()}) {
      if (bytes->size() % 4 != 0) return Error("a tensor's size is not a whole number of floats");
    }
    if (fs.params().size() / 4 != fs.num_elements()) {
      return Error(absl::StrCat("fragment ", fs.fragment(), ": ", fs.params().size(),
                                " bytes of parameters for ", fs.num_elements(), " elements"));
    }
    fs.set_momentum_elements(fs.momentum().size() / 4);
    fs.set_buffer_elements(fs.momentum_buffer().size() / 4);
    fs.set_momentum_hash(compression::Checksum(fs.momentum().data(), fs.momentum().size()));
    fs.set_buffer_hash(
        compression::Checksum(fs.momentum_buffer().data(), fs.momentum_buffer().size()));
    DescribeAsFormat3(fs);
    format1_fragments_.push_back(fs);
    fs.clear_params();
    fs.clear_momentum();
    fs.clear_momentum_buffer();
  }
  format1_ = true;
  file_.reset();
  return absl::OkStatus();
}

absl::Status StateFile::OpenSections(uint64_t size, const char* magic) {
  if (size < 8 + kTail) return Error("truncated (no footer)");
  char tail[kTail];
  if (fseeko(file_.get(), off_t(size - kTail), SEEK_SET) != 0 ||
      std::fread(tail, 1, kTail, file_.get()) != kTail) {
    return Error("cannot read the footer");
  }
  if (std::memcmp(tail + 16, magic, 8) != 0) return Error("truncated (no end marker)");
  const uint64_t footer_len = GetU64(tail);
  if (footer_len > size - 8 - kTail) return Error("footer length past the file's start");
  std::string footer(footer_len, '\0');
  if (fseeko(file_.get(), off_t(size - kTail - footer_len), SEEK_SET) != 0 ||
      std::fread(footer.data(), 1, footer_len, file_.get()) != footer_len) {
    return Error("cannot read the footer");
  }
  if (compression::Checksum(footer.data(), footer.size()) != GetU64(tail + 8)) {
    return Error("footer checksum mismatch (truncated or corrupted)");
  }
  if (!description_.ParseFromString(footer)) return Error("cannot parse the footer");
  const bool format2 = magic == kMagic2;
  // The tensors fill the file between the magic and the footer exactly, fragment by fragment:
  // the parameters, then the optimizer's tensors (format 2: momentum, buffer).
  const uint64_t data_bytes = size - 8 - kTail - footer_len;
  uint64_t at = 8;
  for (auto& fs : *description_.mutable_fragments()) {
    std::vector<std::pair<std::string, uint64_t>> sizes = {{kParams, fs.num_elements()}};
    if (format2) {
      sizes.emplace_back("momentum", fs.momentum_elements());
      sizes.emplace_back("buffer", fs.buffer_elements());
      fs.clear_optimizer_tensors();
      fs.clear_optimizer_counters();
      DescribeAsFormat3(fs);
    } else {
      for (const auto& t : fs.optimizer_tensors()) sizes.emplace_back(t.name(), t.num_elements());
    }
    std::vector<Located> located;
    for (const auto& [name, n] : sizes) {
      if (n > data_bytes / 4 || at - 8 + n * 4 > data_bytes) {
        return Error(absl::StrCat("fragment ", fs.fragment(), ": its tensors run past the data"));
      }
      located.push_back({name, n, at});
      at += n * 4;
    }
    tensors_.push_back(std::move(located));
  }
  if (at - 8 != data_bytes) {
    return Error(absl::StrCat("the tensors take ", at - 8, " bytes, the file holds ", data_bytes));
  }
  return absl::OkStatus();
}

absl::Status StateFile::Read(uint32_t fragment, const std::string& name, float* out,
                             size_t n) const {
  if (fragment >= uint32_t(description_.fragments_size())) return Error("no such fragment");
  if (format1_) {  // from the message
    const auto& fs = format1_fragments_[fragment];
    const std::string* bytes = name == kParams     ? &fs.params()
                               : name == "momentum" ? &fs.momentum()
                               : name == "buffer"   ? &fs.momentum_buffer()
                                                    : nullptr;
    if (bytes == nullptr || bytes->size() != n * 4) return Error("tensor size mismatch");
    if (n > 0) std::memcpy(out, bytes->data(), n * 4);
    return absl::OkStatus();
  }
  for (const Located& t : tensors_[fragment]) {
    if (t.name != name) continue;
    if (t.n != n) return Error("tensor size mismatch");
    if (n == 0) return absl::OkStatus();
    if (fseeko(file_.get(), off_t(t.offset), SEEK_SET) != 0 ||
        std::fread(out, 4, n, file_.get()) != n) {
      return Error(absl::StrCat("cannot read fragment ", fragment, "'s ", name));
    }
    return absl::OkStatus();
  }
  return Error(absl::StrCat("fragment ", fragment, " has no tensor ", name));
}

}  // namespace

absl::StatusOr<pb::ServiceState> WriteServiceState(const std::string& path,
                                                   const outer::SyncServer& server) {
  ATL_ASSIGN_OR_RETURN(auto file, AtomicFile::Create(path));
  ATL_RETURN_IF_ERROR(file->Append(kMagic3, 8));
  auto description = server.Snapshot([&](uint32_t, const std::string&, const float* data, size_t n) {
    return n == 0 ? absl::OkStatus() : file->Append(data, n * 4);
  });
  if (!description.ok()) return description.status();
  const std::string footer = description->SerializeAsString();
  std::string tail;
  PutU64(tail, footer.size());
  PutU64(tail, compression::Checksum(footer.data(), footer.size()));
  tail.append(kMagic3, 8);
  ATL_RETURN_IF_ERROR(file->Append(footer.data(), footer.size()));
  ATL_RETURN_IF_ERROR(file->Append(tail.data(), tail.size()));
  ATL_RETURN_IF_ERROR(file->Commit());
  return description;
}

absl::StatusOr<pb::ServiceState> RestoreServiceState(const std::string& path,
                                                     outer::SyncServer& server) {
  ATL_ASSIGN_OR_RETURN(auto file, StateFile::Open(path));
  if (auto s = server.Restore(file.description(),
                              [&](uint32_t fragment, const std::string& t, float* out,
                                  size_t n) { return file.Read(fragment, t, out, n); });
      !s.ok()) {
    return s;
  }
  return file.description();
}

absl::StatusOr<pb::ServiceState> ReadServiceState(const std::string& path) {
  ATL_ASSIGN_OR_RETURN(auto file, StateFile::Open(path));
  pb::ServiceState state = file.description();
  auto read = [&](int i, const std::string& name, uint64_t n,
                  uint64_t hash) -> absl::StatusOr<std::string> {
    std::vector<float> values(n);
    ATL_RETURN_IF_ERROR(file.Read(uint32_t(i), name, values.data(), n));
    std::string bytes(reinterpret_cast<const char*>(values.data()), n * 4);
    const bool match = name == kParams ? compression::StoredParamsMatch(values.data(), n, hash)
                                       : compression::Checksum(bytes.data(), bytes.size()) == hash;
    if (!match) {
      return absl::DataLossError(
          absl::StrCat(path, ": fragment ", i, " ", name, " does not match its hash"));
    }
    return bytes;
  };
  for (int i = 0; i < state.fragments_size(); ++i) {
    auto* fs = state.mutable_fragments(i);
    ATL_ASSIGN_OR_RETURN(*fs->mutable_params(),
                         read(i, kParams, fs->num_elements(), fs->params_hash()));
    for (auto& t : *fs->mutable_optimizer_tensors()) {
      ATL_ASSIGN_OR_RETURN(*t.mutable_data(), read(i, t.name(), t.num_elements(), t.hash()));
    }
  }
  return state;
}

}  // namespace atl
