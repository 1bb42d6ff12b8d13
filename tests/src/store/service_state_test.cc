// The service's durable state across file formats: states written by the format-2 code (the files
// in tests/src/store/data were written by `atoll local` at ce0da6b, with the config.toml beside them) load
// into today's service, and the named optimizer state they become round-trips through format 3.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "compression/checksum.h"
#include "src/config/config.h"
#include "src/service/coordinator.h"
#include "src/service/initial_state.h"
#include "src/store/service_state_file.h"
#include "tests/test_util.h"

namespace atl {
namespace {

using ::testing::HasSubstr;

std::string Fixture(const std::string& name) {
  return std::string(ATOLL_SOURCE_DIR) + "/tests/src/store/data/" + name;
}

Config FixtureConfig(const std::string& name) {
  std::ifstream in(Fixture(name));
  std::stringstream text;
  text << in.rdbuf();
  auto config = ParseConfig(text.str(), name);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

struct Fixtures {
  std::string state, config;
  std::vector<std::string> params_hashes;  // each fragment's, from the run's rounds.jsonl
  std::vector<std::string> tensors;        // the nesterov optimizer's tensors it held
};

const Fixtures kFixtures[] = {
    {"service_state_v2_sync.pb", "service_state_v2_sync.toml",
     {"fd9888496f84f66e", "4677e95269d3bc00"}, {"momentum"}},
    {"service_state_v2_async.pb", "service_state_v2_async.toml", {"265a908efcb9ffab"},
     {"momentum", "buffer"}},
};

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

TEST(ServiceStateTest, AFormatTwoStateLoadsAndRoundTripsThroughFormatThree) {
  for (const Fixtures& f : kFixtures) {
    SCOPED_TRACE(f.state);
    const Config config = FixtureConfig(f.config);
    auto server = MakeSyncServer(config);
    ASSERT_TRUE(server.ok()) << server.status();
    auto restored = RestoreServiceState(Fixture(f.state), **server);
    ASSERT_TRUE(restored.ok()) << restored.status();
    ASSERT_EQ((*server)->num_fragments(), f.params_hashes.size());
    for (uint32_t i = 0; i < (*server)->num_fragments(); ++i) {
      // The file (written before ParamsHash) stored the XXH64 of these very parameters; the
      // service hashes them as every copy does now.
      const std::vector<float> p = (*server)->params(i);
      EXPECT_EQ(Hex(compression::Checksum(p.data(), p.size() * sizeof(float))),
                f.params_hashes[i])
          << "fragment " << i;
      EXPECT_EQ((*server)->params_hash(i), compression::ParamsHash(p.data(), 0, p.size()));
    }
    // The old fields become the nesterov optimizer's named tensors, their bytes unchanged.
    auto old = ReadServiceState(Fixture(f.state));
    ASSERT_TRUE(old.ok()) << old.status();
    const auto& fs = old->fragments(0);
    EXPECT_EQ(fs.optimizer(), "nesterov");
    ASSERT_EQ(fs.optimizer_tensors_size(), int(f.tensors.size()));
    for (size_t t = 0; t < f.tensors.size(); ++t) {
      EXPECT_EQ(fs.optimizer_tensors(int(t)).name(), f.tensors[t]);
      EXPECT_EQ(fs.optimizer_tensors(int(t)).hash(),
                t == 0 ? fs.momentum_hash() : fs.buffer_hash());
    }
    // Written again (format 3) and read back: the same parameters and optimizer state.
    testing::TempDir dir;
    const std::string again = dir.Join("state.pb");
    ASSERT_TRUE(WriteServiceState(again, **server).ok());
    std::ifstream in(again, std::ios::binary);
    char magic[8];
    in.read(magic, 8);
    EXPECT_EQ(std::string(magic, 8), "ATOLLSV3");
    auto now = ReadServiceState(again);
    ASSERT_TRUE(now.ok()) << now.status();
    ASSERT_EQ(now->fragments_size(), old->fragments_size());
    for (int i = 0; i < now->fragments_size(); ++i) {
      const auto& a = old->fragments(i);
      const auto& b = now->fragments(i);
      EXPECT_EQ(a.params(), b.params());
      EXPECT_EQ(a.round(), b.round());
      ASSERT_EQ(a.optimizer_tensors_size(), b.optimizer_tensors_size());
      for (int t = 0; t < a.optimizer_tensors_size(); ++t) {
        EXPECT_EQ(a.optimizer_tensors(t).name(), b.optimizer_tensors(t).name());
        EXPECT_EQ(a.optimizer_tensors(t).data(), b.optimizer_tensors(t).data());
      }
      ASSERT_EQ(a.optimizer_counters_size(), b.optimizer_counters_size());
      for (int c = 0; c < a.optimizer_counters_size(); ++c) {
        EXPECT_EQ(a.optimizer_counters(c).value(), b.optimizer_counters(c).value());
      }
    }
  }
}

// A state is refused, all or nothing, by a service whose optimizer keeps other state: by name.
TEST(ServiceStateTest, AnotherOuterOptimizerIsRefusedByName) {
  Config config = FixtureConfig("service_state_v2_sync.toml");
  config.outer.optimizer.name = "sgd";
  auto server = MakeSyncServer(config);
  ASSERT_TRUE(server.ok()) << server.status();
  const uint64_t before = (*server)->params_hash(0);
  auto restored = RestoreServiceState(Fixture("service_state_v2_sync.pb"), **server);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(restored.status().message()), HasSubstr("nesterov"));
  EXPECT_EQ((*server)->params_hash(0), before);

  Config no_momentum = FixtureConfig("service_state_v2_sync.toml");
  no_momentum.outer.optimizer.momentum = 0;
  auto plain = MakeSyncServer(no_momentum);
  ASSERT_TRUE(plain.ok());
  restored = RestoreServiceState(Fixture("service_state_v2_sync.pb"), **plain);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(restored.status().message()), HasSubstr("momentum"));
}

}  // namespace
}  // namespace atl
