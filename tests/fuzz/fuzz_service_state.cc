// The coordinator's durable state on arbitrary files: the reader, then restoring what it accepted
// into a service (all or nothing: a refused state leaves the service as it was). With the first
// input byte odd, the rest is the state message and the harness writes it with a valid file
// checksum and valid parameter hashes, to reach the checks behind them.
#include <cstdlib>
#include <vector>

#include "atoll/v1/service_state.pb.h"
#include "compression/checksum.h"
#include "outer/sync_server.h"
#include "src/coordinator_command.h"
#include "tests/fuzz/fuzz_input.h"

using namespace atl;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const bool fix = in.Number<uint8_t>() % 2 == 1;
  std::string file = in.Rest();
  if (fix) {
    std::string message = file;
    ::atollpb::v1::ServiceState parsed;
    if (parsed.ParseFromString(message)) {
      for (auto& f : *parsed.mutable_fragments()) {
        f.set_params_hash(compression::Checksum(f.params().data(), f.params().size()));
      }
      message = parsed.SerializeAsString();
    }
    const uint64_t sum = compression::Checksum(message.data(), message.size());
    file = "ATOLLSV1" + std::string(reinterpret_cast<const char*>(&sum), 8) + message;
  }
  const std::string path = fuzz::WriteScratch(
      "state", reinterpret_cast<const uint8_t*>(file.data()), file.size());
  auto state = ReadServiceState(path);
  if (!state.ok()) return 0;
  outer::SyncServerOptions o;
  o.run_id = "run";
  o.config_hash = 7;
  o.optimizer.momentum_delay = size % 3;
  outer::SyncServer server(o, {{{"w"}, {5}}, {{"v"}, {3}}},
                           {std::vector<float>(5, 1.0f), std::vector<float>(3, 2.0f)});
  const uint64_t before = server.params_hash(0);
  if (!server.Restore(*state).ok() && server.params_hash(0) != before) std::abort();
  return 0;
}
