#include "src/store/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "compression/codec_math.h"
#include "compression/status_macros.h"
#include "nlohmann/json.hpp"
#include "src/store/atomic_file.h"

namespace atl::safetensors {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Bytes per element of the format's dtypes; 0 for a name the format does not have.
uint64_t ElementBytes(const std::string& dtype) {
  static const std::map<std::string, uint64_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
      {"F64", 8},  {"I64", 8}, {"U64", 8}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return compression::math::FromBits(sign | 0x7F800000u | (mantissa << 13));
  if (exponent != 0) {
    return compression::math::FromBits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
  // Zero or subnormal: mantissa * 2^-24, exact in fp32.
  const float magnitude = float(mantissa) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
}

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors file ", path, ": ", what));
}

// One header entry -> TensorInfo, checked on its own (its place in the data region is checked
// with the others).
absl::StatusOr<TensorInfo> ParseEntry(const std::string& path, const std::string& name,
                                      const json& entry, uint64_t data_bytes) {
  auto bad = [&](const std::string& what) { return Bad(path, absl::StrCat("tensor '", name, "': ", what)); };
  if (!entry.is_object()) return bad("its entry is not an object");
  for (const auto& [key, value] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return bad(absl::StrCat("unknown field '", key, "'"));
    }
  }
  if (!entry.contains("dtype") || !entry["dtype"].is_string()) return bad("no dtype string");
  TensorInfo t;
  t.name = name;
  t.dtype = entry["dtype"].get<std::string>();
  const uint64_t element = ElementBytes(t.dtype);
  if (element == 0) return bad(absl::StrCat("unknown dtype '", t.dtype, "'"));
  if (!entry.contains("shape") || !entry["shape"].is_array()) return bad("no shape array");
  if (entry["shape"].size() > 16) return bad("more than 16 dimensions");
  uint64_t numel = 1;
  for (const auto& d : entry["shape"]) {
    if (!d.is_number_unsigned()) return bad("a dimension is not a non-negative integer");
    const uint64_t dim = d.get<uint64_t>();
    if (dim > uint64_t(INT64_MAX) || (dim != 0 && numel > data_bytes / dim)) {
      return bad("its shape holds more elements than the file");
    }
    numel *= dim;
    t.shape.push_back(int64_t(dim));
  }
  const auto& offsets = entry.contains("data_offsets") ? entry["data_offsets"] : json();
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return bad("data_offsets is not [begin, end] of non-negative integers");
  }
  t.begin = offsets[0].get<uint64_t>();
  t.end = offsets[1].get<uint64_t>();
  if (t.begin > t.end || t.end > data_bytes) {
    return bad(absl::StrCat("data_offsets [", t.begin, ", ", t.end, "] are outside the ",
                            data_bytes, " data bytes"));
  }
  if (numel > data_bytes / element || t.end - t.begin != numel * element) {
    return bad(absl::StrCat("data_offsets span ", t.end - t.begin, " bytes, its ", t.dtype,
                            " shape needs ", numel * element));
  }
  return t;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<File> File::Open(const std::string& path) {
  std::error_code ec;
  const uint64_t file_size = fs::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", ec.message()));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  uint8_t prefix[8];
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(prefix), 8)) {
    return Bad(path, "shorter than its 8-byte header length");
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | prefix[i];
  if (header_bytes > kMaxHeaderBytes) {
    return Bad(path, absl::StrCat("header length ", header_bytes, " exceeds the format's limit of ",
                                  kMaxHeaderBytes, " bytes"));
  }
  if (header_bytes > file_size - 8) {
    return Bad(path, absl::StrCat("header length ", header_bytes, " exceeds the file (",
                                  file_size, " bytes)"));
  }
  std::string text(header_bytes, '\0');
  if (!in.read(text.data(), std::streamsize(header_bytes))) return Bad(path, "short read of the header");
  if (text.empty() || text[0] != '{') return Bad(path, "the header does not start with '{'");

  // Names must be unique: the parser keeps the last of a repeated key, so repeats are caught here.
  std::set<std::string> seen;
  std::string repeated;
  const json header = json::parse(
      text,
      [&](int depth, json::parse_event_t event, json& parsed) {
        if (depth == 1 && event == json::parse_event_t::key && !seen.insert(parsed.get<std::string>()).second) {
          repeated = parsed.get<std::string>();
        }
        return true;
      },
      /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Bad(path, "the header is not a JSON object (or not UTF-8)");
  }
  if (!repeated.empty()) return Bad(path, absl::StrCat("tensor '", repeated, "' appears twice"));

  File file;
  file.path_ = path;
  file.data_start_ = 8 + header_bytes;
  const uint64_t data_bytes = file_size - file.data_start_;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Bad(path, "__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) return Bad(path, absl::StrCat("metadata '", key, "' is not a string"));
        file.metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    ATL_ASSIGN_OR_RETURN(auto t, ParseEntry(path, name, entry, data_bytes));
    file.tensors_.push_back(std::move(t));
  }
  // The entries tile the data region: sorted by offset, each starts where the previous ended.
  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
            });
  uint64_t next = 0;
  for (const auto& t : file.tensors_) {
    if (t.begin != next) {
      return Bad(path, absl::StrCat("tensor '", t.name, "' starts at byte ", t.begin, " of the data, ",
                                    t.begin < next ? "overlapping the tensor before it" : "leaving a hole",
                                    " (expected ", next, ")"));
    }
    next = t.end;
  }
  if (next != data_bytes) {
    return Bad(path, absl::StrCat("the tensors cover ", next, " of the ", data_bytes, " data bytes"));
  }
  return file;
}

const TensorInfo* File::Find(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<std::vector<float>> File::ReadFloats(const TensorInfo& t) const {
  if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16") {
    return absl::InvalidArgumentError(absl::StrCat("safetensors file ", path_, ": tensor '", t.name,
                                                   "' is ", t.dtype, "; atoll reads F32, F16 and BF16"));
  }
  std::ifstream in(path_, std::ios::binary);
  std::string bytes(t.end - t.begin, '\0');
  in.seekg(std::streamoff(data_start_ + t.begin));
  if (!in || !in.read(bytes.data(), std::streamsize(bytes.size()))) {
    return absl::DataLossError(absl::StrCat("safetensors file ", path_, ": short read of '", t.name, "'"));
  }
  std::vector<float> out(size_t(t.numel()));
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (t.dtype == "F32") {
    std::memcpy(out.data(), p, bytes.size());  // little-endian, like the hosts atoll runs on
    return out;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const uint16_t h = uint16_t(p[2 * i] | (p[2 * i + 1] << 8));
    out[i] = t.dtype == "F16" ? HalfToFloat(h) : compression::math::Bf16Value(h);
  }
  return out;
}

absl::Status Write(const std::string& path, const std::vector<TensorView>& tensors,
                   const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const auto& t : tensors) {
    if (t.dtype != "F32" && t.dtype != "BF16") {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: cannot write ", t.dtype, " (", t.name, ")"));
    }
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= uint64_t(d);
    sizes.push_back(numel * (t.dtype == "F32" ? 4 : 2));
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + sizes.back()}}};
    offset += sizes.back();
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  uint8_t prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  ATL_ASSIGN_OR_RETURN(auto file, AtomicFile::Create(path));
  ATL_RETURN_IF_ERROR(file->Append(prefix, 8));
  ATL_RETURN_IF_ERROR(file->Append(text.data(), text.size()));
  for (size_t i = 0; i < tensors.size(); ++i) {
    ATL_RETURN_IF_ERROR(file->Append(tensors[i].data, sizes[i]));
  }
  return file->Commit();
}

}  // namespace atl::safetensors
