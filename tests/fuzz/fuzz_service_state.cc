// The coordinator's durable state on arbitrary files: restoring one into a service (all or
// nothing: a refused state leaves the service as it was), and the whole-file reader. With the first
// input byte odd, the input is a record holding the description (the footer message) and then the
// tensor data, and the harness writes them as a format-2 or format-3 file (second bit) with a valid
// footer checksum and valid tensor hashes, to reach the checks behind them.
#include <cstdlib>
#include <vector>

#include "atoll/v1/service_state.pb.h"
#include "compression/checksum.h"
#include "outer/service/sync_server.h"
#include "src/store/service_state_file.h"
#include "tests/fuzz/fuzz_input.h"

using namespace atl;

namespace {

void PutU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }

// A file of `format` (2 or 3) around the description and data, with the hashes the data has.
std::string Sectioned(int format, std::string description, const std::string& data) {
  ::atollpb::v1::ServiceState parsed;
  if (parsed.ParseFromString(description)) {
    uint64_t at = 0;
    auto hash = [&](uint64_t n) {
      const uint64_t bytes = n * 4;
      if (n > data.size() || at + bytes > data.size()) return uint64_t(0);
      const uint64_t h = compression::Checksum(data.data() + at, bytes);
      at += bytes;
      return h;
    };
    for (auto& f : *parsed.mutable_fragments()) {
      f.set_params_hash(hash(f.num_elements()));
      if (format == 2) {
        f.set_momentum_hash(hash(f.momentum_elements()));
        f.set_buffer_hash(hash(f.buffer_elements()));
      } else {
        for (auto& t : *f.mutable_optimizer_tensors()) t.set_hash(hash(t.num_elements()));
      }
    }
    description = parsed.SerializeAsString();
  }
  const std::string magic = format == 2 ? "ATOLLSV2" : "ATOLLSV3";
  std::string file = magic + data + description;
  PutU64(file, description.size());
  PutU64(file, compression::Checksum(description.data(), description.size()));
  return file + magic;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t mode = in.Number<uint8_t>();
  std::string file;
  if (mode % 2 == 1) {
    std::string description = in.Record();
    file = Sectioned((mode & 2) ? 3 : 2, std::move(description), in.Rest());
  } else {
    file = in.Rest();
  }
  const std::string path = fuzz::WriteScratch(
      "state", reinterpret_cast<const uint8_t*>(file.data()), file.size());
  outer::SyncServerOptions o;
  o.run_id = "run";
  o.config_hash = 7;
  o.optimizer.momentum_delay = size % 3;
  outer::SyncServer server(o, {{{"w"}, {5}}, {{"v"}, {3}}},
                           {std::vector<float>(5, 1.0f), std::vector<float>(3, 2.0f)});
  const uint64_t before = server.params_hash(0);
  const std::vector<float> params_before = server.params(1);
  if (!RestoreServiceState(path, server).ok() &&
      (server.params_hash(0) != before || server.params(1) != params_before)) {
    std::abort();
  }
  ReadServiceState(path).IgnoreError();
  return 0;
}
