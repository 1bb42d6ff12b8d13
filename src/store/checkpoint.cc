#include "src/store/checkpoint.h"

#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "atoll/v1/checkpoint.pb.h"
#include "compression/checksum.h"
#include "compression/status_macros.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
namespace pb = ::atollpb::v1;

constexpr char kMagic[8] = {'A', 'T', 'O', 'L', 'L', 'C', 'K', '1'};
// 2: row-parallel weights are sliced in their input-major order (the plan's canonical order).
constexpr uint32_t kFormatVersion = 2;
constexpr size_t kAlign = 64;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

absl::StatusOr<pb::DType> ToProto(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return pb::DTYPE_FLOAT32;
    case torch::kBFloat16: return pb::DTYPE_BFLOAT16;
    case torch::kHalf: return pb::DTYPE_FLOAT16;
    case torch::kLong: return pb::DTYPE_INT64;
    case torch::kByte: return pb::DTYPE_UINT8;
    default: return absl::InvalidArgumentError(absl::StrCat("unsupported dtype ", c10::toString(t)));
  }
}

absl::StatusOr<torch::ScalarType> FromProto(pb::DType t) {
  switch (t) {
    case pb::DTYPE_FLOAT32: return torch::kFloat;
    case pb::DTYPE_BFLOAT16: return torch::kBFloat16;
    case pb::DTYPE_FLOAT16: return torch::kHalf;
    case pb::DTYPE_INT64: return torch::kLong;
    case pb::DTYPE_UINT8: return torch::kByte;
    default: return absl::InvalidArgumentError(absl::StrCat("unknown dtype code ", int(t)));
  }
}

// Writes the pieces to `path` atomically.
absl::Status WritePiecesAtomic(const std::string& path,
                               const std::vector<std::pair<const void*, size_t>>& pieces) {
  ATL_ASSIGN_OR_RETURN(auto file, AtomicFile::Create(path));
  for (const auto& [data, size] : pieces) {
    ATL_RETURN_IF_ERROR(file->Append(data, size));
  }
  return file->Commit();
}

constexpr char kManifest[] = "manifest.json";

absl::StatusOr<int64_t> StepOfCheckpoint(std::string filename) {
  // step-00000200 (a directory) or step-00000200.ckpt (a file written before rank shards)
  if (absl::EndsWith(filename, ".ckpt")) filename.resize(filename.size() - 5);
  int64_t step;
  if (!absl::StartsWith(filename, "step-") || !absl::SimpleAtoi(filename.substr(5), &step)) {
    return absl::InvalidArgumentError("not a checkpoint name");
  }
  return step;
}

std::string RankFileName(int rank, int world) {
  return absl::StrFormat("rank-%05d-of-%05d.ckpt", rank, world);
}

// The rank files a manifest lists, all present; or why not.
absl::StatusOr<std::vector<std::string>> CompleteRankFiles(const std::string& dir) {
  std::ifstream in(fs::path(dir) / kManifest);
  if (!in) return absl::NotFoundError(absl::StrCat(dir, ": no manifest (an incomplete checkpoint)"));
  const auto manifest = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded() || !manifest.contains("files") || !manifest["files"].is_array()) {
    return absl::DataLossError(absl::StrCat(dir, "/", kManifest, " cannot be parsed"));
  }
  std::vector<std::string> files;
  for (const auto& f : manifest["files"]) {
    if (!f.is_string()) return absl::DataLossError(absl::StrCat(dir, ": bad manifest"));
    const std::string name = f.get<std::string>();
    if (name.find('/') != std::string::npos || name.empty()) {
      return absl::DataLossError(absl::StrCat(dir, ": bad file name in the manifest"));
    }
    const std::string path = (fs::path(dir) / name).string();
    if (!fs::exists(path)) {
      return absl::NotFoundError(absl::StrCat(dir, ": ", name, " is missing (a rank did not finish)"));
    }
    files.push_back(path);
  }
  if (files.empty()) return absl::DataLossError(absl::StrCat(dir, ": the manifest lists no files"));
  return files;
}

std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(run_dir) / "checkpoints", ec)) {
    auto step = StepOfCheckpoint(e.path().filename().string());
    if (!step.ok()) continue;
    if (e.is_directory() ? CompleteRankFiles(e.path().string()).ok()
                         : e.is_regular_file() && e.path().extension() == ".ckpt") {
      out.emplace_back(*step, e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

absl::Status WriteCheckpoint(const std::string& path, const inner::TrainerState& state,
                             const CheckpointMeta& meta) {
  pb::CheckpointHeader header;
  header.set_format_version(kFormatVersion);
  header.set_step(state.step);
  header.set_adam_step(state.adam_step);
  header.mutable_cursor()->set_epoch(state.cursor.epoch);
  header.mutable_cursor()->set_index(state.cursor.index);
  header.set_wall_s(meta.wall_s);
  header.set_config_toml(meta.config_toml);
  if (state.rng_state.defined()) {
    auto rng = state.rng_state.contiguous();
    header.set_rng_state(rng.data_ptr(), size_t(rng.nbytes()));
  }
  std::vector<torch::Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& t : state.tensors) {
    ATL_ASSIGN_OR_RETURN(auto dtype, ToProto(t.values.scalar_type()));
    auto c = t.values.to(torch::kCPU).contiguous().reshape({-1});
    auto* rec = header.add_tensors();
    rec->set_name(t.name);
    rec->set_dtype(dtype);
    for (auto d : t.shape) rec->add_shape(d);
    rec->set_slice_offset(uint64_t(t.offset));
    rec->set_slice_numel(uint64_t(c.numel()));
    rec->set_offset(offset);
    rec->set_num_bytes(c.nbytes());
    rec->set_xxh64(compression::Checksum(c.data_ptr(), c.nbytes()));
    offset = AlignUp(offset + c.nbytes());
    contiguous.push_back(std::move(c));
  }
  header.set_data_bytes(offset);
  const std::string header_bytes = header.SerializeAsString();
  const uint64_t header_len = header_bytes.size();
  const uint64_t header_sum = compression::Checksum(header_bytes.data(), header_bytes.size());
  const size_t prefix = sizeof(kMagic) + 16 + header_bytes.size();
  static const char kZeros[kAlign] = {};

  std::vector<std::pair<const void*, size_t>> pieces = {
      {kMagic, sizeof(kMagic)},
      {&header_len, 8},
      {&header_sum, 8},
      {header_bytes.data(), header_bytes.size()},
      {kZeros, AlignUp(prefix) - prefix}};
  for (const auto& c : contiguous) {
    pieces.emplace_back(c.data_ptr(), c.nbytes());
    pieces.emplace_back(kZeros, AlignUp(c.nbytes()) - c.nbytes());
  }
  return WritePiecesAtomic(path, pieces);
}

static absl::StatusOr<Checkpoint> ReadCheckpointFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open checkpoint ", path));
  auto corrupt = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", what));
  };
  char magic[8];
  uint64_t header_len = 0, header_sum = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&header_len), 8);
  in.read(reinterpret_cast<char*>(&header_sum), 8);
  if (!in || std::memcmp(magic, kMagic, 8) != 0) return corrupt("not an atoll checkpoint");
  const auto file_size = fs::file_size(path);
  if (header_len > file_size) return corrupt("header length exceeds the file");
  std::string header_bytes(header_len, '\0');
  in.read(header_bytes.data(), std::streamsize(header_len));
  if (!in || compression::Checksum(header_bytes.data(), header_len) != header_sum) {
    return corrupt("header checksum mismatch");
  }
  pb::CheckpointHeader header;
  if (!header.ParseFromString(header_bytes)) return corrupt("unparsable header");
  if (header.format_version() != kFormatVersion) {
    return corrupt(absl::StrCat("format version ", header.format_version(), ", expected ",
                                kFormatVersion));
  }
  const size_t data_start = AlignUp(sizeof(kMagic) + 16 + header_len);
  if (header.data_bytes() > file_size || data_start > file_size - header.data_bytes()) {
    return corrupt("truncated data region");
  }

  Checkpoint out;
  out.state.step = header.step();
  out.state.adam_step = header.adam_step();
  out.state.cursor = {header.cursor().epoch(), header.cursor().index()};
  out.meta.wall_s = header.wall_s();
  out.meta.config_toml = header.config_toml();
  if (!header.rng_state().empty()) {
    out.state.rng_state = torch::empty({int64_t(header.rng_state().size())}, torch::kByte);
    std::memcpy(out.state.rng_state.data_ptr(), header.rng_state().data(),
                header.rng_state().size());
  }
  for (const auto& rec : header.tensors()) {
    auto dtype = FromProto(rec.dtype());
    if (!dtype.ok()) return corrupt(absl::StrCat(rec.name(), ": ", dtype.status().message()));
    // The shape and slice must account for exactly the bytes the record holds, inside the file,
    // before anything is allocated: a header cannot make the reader allocate what the file does
    // not hold.
    std::vector<int64_t> shape(rec.shape().begin(), rec.shape().end());
    uint64_t numel = 1;
    bool fits = shape.size() <= 16;
    for (int64_t d : shape) {
      fits = fits && d >= 0 && (d == 0 || numel <= UINT64_MAX / uint64_t(d));
      if (fits) numel *= uint64_t(d);
    }
    const uint64_t slice = rec.slice_numel() == 0 ? numel : rec.slice_numel();
    const uint64_t elem = c10::elementSize(*dtype);
    fits = fits && rec.slice_offset() <= numel && slice <= numel - rec.slice_offset() &&
           slice <= UINT64_MAX / elem;
    if (!fits || slice * elem != rec.num_bytes() || rec.offset() > header.data_bytes() ||
        rec.num_bytes() > header.data_bytes() - rec.offset()) {
      return corrupt(absl::StrCat(rec.name(), ": size does not match its shape or the file"));
    }
    auto t = torch::empty({int64_t(slice)}, *dtype);
    in.seekg(std::streamoff(data_start + rec.offset()));
    in.read(static_cast<char*>(t.data_ptr()), std::streamsize(rec.num_bytes()));
    if (!in) return corrupt(absl::StrCat(rec.name(), ": short read"));
    if (compression::Checksum(t.data_ptr(), rec.num_bytes()) != rec.xxh64()) {
      return corrupt(absl::StrCat(rec.name(), ": checksum mismatch"));
    }
    out.state.tensors.push_back({rec.name(), std::move(t), int64_t(rec.slice_offset()), shape});
  }
  return out;
}

absl::Status WriteCheckpointShard(const std::string& dir, int rank, int world,
                                  const inner::TrainerState& state, const CheckpointMeta& meta) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", dir, ": ", ec.message()));
  ATL_RETURN_IF_ERROR(
      WriteCheckpoint((fs::path(dir) / RankFileName(rank, world)).string(), state, meta));
  if (rank != 0) return absl::OkStatus();
  nlohmann::json manifest = {{"format", "atoll-checkpoint"}, {"step", state.step},
                             {"world_size", world}, {"wall_s", meta.wall_s}};
  for (int r = 0; r < world; ++r) manifest["files"].push_back(RankFileName(r, world));
  return WriteFileAtomic((fs::path(dir) / kManifest).string(), manifest.dump(2) + "\n");
}

absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path) {
  if (!fs::is_directory(path)) return ReadCheckpointFile(path);
  ATL_ASSIGN_OR_RETURN(auto files, CompleteRankFiles(path));
  Checkpoint merged;
  for (size_t i = 0; i < files.size(); ++i) {
    ATL_ASSIGN_OR_RETURN(auto part, ReadCheckpointFile((files)[i]));
    if (i == 0) {
      merged.meta = part.meta;
      merged.state.step = part.state.step;
      merged.state.adam_step = part.state.adam_step;
      merged.state.cursor = part.state.cursor;
      merged.state.rng_state = part.state.rng_state;
    } else if (part.state.step != merged.state.step) {
      return absl::DataLossError(absl::StrCat(path, ": its rank files are of different steps"));
    }
    for (auto& t : part.state.tensors) merged.state.tensors.push_back(std::move(t));
  }
  return merged;
}

std::string CheckpointPath(const std::string& run_dir, int64_t step) {
  return (fs::path(run_dir) / "checkpoints" / absl::StrFormat("step-%08d", step)).string();
}

absl::StatusOr<std::string> LatestCheckpoint(const std::string& run_dir) {
  auto all = ListCheckpoints(run_dir);
  if (all.empty()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint in ", run_dir, "/checkpoints"));
  }
  return all.back().second;
}

void PruneCheckpoints(const std::string& run_dir, int keep) {
  auto all = ListCheckpoints(run_dir);
  std::error_code ec;
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) fs::remove_all(all[i].second, ec);
}

}  // namespace atl
