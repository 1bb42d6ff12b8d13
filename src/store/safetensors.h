// The safetensors file format (Hugging Face): an 8-byte little-endian header length N, N bytes of
// JSON ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ..., "__metadata__": {string:
// string}}), then the tensors' bytes, little-endian, offsets relative to the end of the header.
// Torch-free: models are mapped onto it in src/store/model_io.
//
// Reading follows the format's rules and trusts nothing: the header is bounded (100 MB), every
// entry's dtype, shape and offsets must account for exactly its bytes, the entries must cover the
// data region without holes or overlaps, and names are unique. A file that breaks a rule is refused
// with an error naming the rule and the entry; nothing is allocated from a size the file does not
// hold.
#ifndef ATOLL_SRC_STORE_SAFETENSORS_H_
#define ATOLL_SRC_STORE_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace atl::safetensors {

inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  std::string dtype;  // "F32", "BF16", "I64", ... as written in the file
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data region
  int64_t numel() const;
};

// An opened file: its checked header. Tensors are read one at a time.
class File {
 public:
  static absl::StatusOr<File> Open(const std::string& path);

  const std::string& path() const { return path_; }
  // In the order of their data.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* Find(const std::string& name) const;

  // The tensor's values as fp32: F32 as stored, F16 and BF16 widened exactly. Other dtypes are
  // refused by name.
  absl::StatusOr<std::vector<float>> ReadFloats(const TensorInfo& tensor) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // numel(shape) values of `dtype`, little-endian
  std::string dtype = "F32";   // "F32" or "BF16"
};

// Writes the tensors (in the given order) and the metadata, atomically (temp file, fsync, rename).
// The header is padded with spaces so the data starts 8-byte aligned.
absl::Status Write(const std::string& path, const std::vector<TensorView>& tensors,
                   const std::map<std::string, std::string>& metadata);

}  // namespace atl::safetensors

#endif  // ATOLL_SRC_STORE_SAFETENSORS_H_
