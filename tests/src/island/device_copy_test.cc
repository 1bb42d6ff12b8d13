// The outer round on the device (outer.global_copy = "device", src/island/tensor_device_copy.h):
// on the CPU the host engine runs the whole device path against the host path, bit for bit, with
// FP4 and with the sparse codec; on a GPU the CUDA engine against the host engine, and GPU
// islands with device copies.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "compression/codec.h"
#include "outer/base/outer_config.h"
#include "src/island/tensor_device_copy.h"
#include "src/service/coordinator.h"
#include "src/service/initial_state.h"
#include "tests/src/island/diloco_util.h"
#include "tests/test_util.h"

namespace atl {
namespace {

using ::atl::testing::TempDir;

// outer.global_copy = "device" on the CPU runs the whole device path (the pseudo-gradient made in
// tensors beside the parameters and encoded by the host engine, error feedback kept there, each
// update applied to the device copy from its encoded chunks, merges from it): the same bits as the
// host path.
void ExpectTheDevicePathGivesTheHostPathsBits(const Config& c) {
  auto run = [&](const std::string& where) {
    auto d = c;
    EXPECT_TRUE(outer::ParseConfigValue(where, &d.outer.global_copy).ok());
    auto server = *MakeSyncServer(d);
    TempDir runs;
    auto results = RunIslands(d, *server, runs);
    EXPECT_TRUE(results[0].ok()) << results[0].status();
    std::vector<std::vector<float>> params;
    for (uint32_t f = 0; f < server->num_fragments(); ++f) params.push_back(server->params(f));
    return std::make_pair(params, *results[0]);
  };
  const auto [host_params, host] = run("host");
  const auto [device_params, device] = run("device");
  EXPECT_EQ(host.global_copy, "host");
  EXPECT_EQ(device.global_copy, "device");
  EXPECT_GE(device.rounds, 8u);
  EXPECT_EQ(device.rounds, host.rounds);
  EXPECT_EQ(device.resyncs, 0u);
  EXPECT_TRUE(device_params == host_params);
  EXPECT_EQ(device.global_hash, host.global_hash);
  ASSERT_TRUE(device.last_eval && host.last_eval);
  EXPECT_EQ(device.last_eval->loss, host.last_eval->loss);  // the local parameters too
}

// One island of StreamingConfig for 20 steps, with error feedback and stochastic rounding.
Config DevicePathConfig(const TempDir& dir) {
  auto c = StreamingConfig(dir);
  c.outer.islands = 1;
  c.train.steps = 20;
  c.outer.error_feedback = true;
  c.outer.stochastic_rounding = true;
  return c;
}

// FP4, tau 2 and alpha 0.5.
TEST(StreamingTest, ADeviceCopyGivesTheHostPathsBits) {
  TempDir dir;
  auto c = DevicePathConfig(dir);
  c.outer.fragment_update_alpha = 0.5;
  ExpectTheDevicePathGivesTheHostPathsBits(c);
}

// The sparse codec (2% int2, decayed error feedback, plain SGD): top-k, the residual of what was
// not sent and the sparse updates all on the device path.
TEST(StreamingTest, ASparseDeviceCopyGivesTheHostPathsBits) {
  TempDir dir;
  auto c = DevicePathConfig(dir);
  c.outer.error_feedback_decay = 0.8f;
  c.outer.topk_density = 0.02;
  c.outer.topk_chunk = 1024;
  c.outer.codec = *compression::ParseCodec("int2");
  c.outer.optimizer.name = "sgd";
  c.outer.optimizer.lr = 1.0;
  c.outer.optimizer.momentum = 0;
  ASSERT_TRUE(Validate(c).ok()) << Validate(c);
  ExpectTheDevicePathGivesTheHostPathsBits(c);
}

// On a GPU, islands with their global copies on the device (the default there): every copy stays
// bit-identical to the service's, with FP4 and error feedback, and nothing resyncs.
TEST(StreamingTest, GpuDeviceCopiesStayBitIdentical) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TempDir dir;
  auto c = StreamingConfig(dir);
  c.train.steps = 24;
  c.train.device = "cuda";
  c.outer.error_feedback = true;
  auto server = *MakeSyncServer(c);
  const auto results = RunIslands(c, *server, dir);
  const uint64_t hash = ServiceHash(*server);
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->global_copy, "device");
    EXPECT_EQ(r->global_hash, hash);
    EXPECT_EQ(r->resyncs, 0u);
    EXPECT_GE(r->rounds, 8u);
  }
}

// The CUDA engine against the host engine on the same inputs: the same encoded bytes, exact
// samples, residuals and global copies, bit for bit, through a capture, an update and a second
// capture that carries the residual.
TEST(TensorDeviceCopyTest, GpuEqualsTheHostBitForBit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = (1 << 20) + 17;
  torch::manual_seed(5);
  const auto local = torch::randn({n});
  std::vector<float> global(static_cast<size_t>(n));
  const auto g = (local + 1e-3 * torch::randn({n})).contiguous();
  std::memcpy(global.data(), g.data_ptr<float>(), size_t(n) * 4);
  const auto spec = *compression::ParseCodec("fp4_e2m1");
  struct Side {
    at::Tensor params;
    std::unique_ptr<TensorDeviceCopy> copy;
  };
  auto make = [&](const at::Device& device) {
    Side s;
    s.params = local.to(device).clone();
    auto copy = TensorDeviceCopy::Create([p = s.params] { return std::vector<at::Tensor>{p}; },
                                         uint64_t(n), device);
    EXPECT_TRUE(copy.ok()) << copy.status();
    s.copy = *std::move(copy);
    EXPECT_TRUE(s.copy->Load(global).ok());
    return s;
  };
  Side cpu = make(at::kCPU), gpu = make(at::Device(at::kCUDA, 0));
  ASSERT_TRUE(gpu.copy->on_device());
  const uint64_t chunk = 300000;  // chunks that end inside scale blocks' runs
  auto encode_both = [&](uint64_t seed) {
    for (uint64_t at = 0; at < uint64_t(n); at += chunk) {
      const uint64_t k = std::min<uint64_t>(chunk, uint64_t(n) - at);
      const compression::Rounding r{true, seed, at};
      std::vector<uint8_t> a(compression::EncodedBytes(spec, k)), b(a.size(), 0xAB);
      std::vector<float> ea(64), eb(64);
      ASSERT_TRUE(cpu.copy->Encode(spec, at, k, r, a.data(), ea.data(), 64).ok());
      ASSERT_TRUE(gpu.copy->Encode(spec, at, k, r, b.data(), eb.data(), 64).ok());
      ASSERT_EQ(a, b) << "chunk at " << at;
      ASSERT_EQ(0, std::memcmp(ea.data(), eb.data(), 64 * 4));
    }
    cpu.copy->KeepResidual();
    gpu.copy->KeepResidual();
  };
  ASSERT_TRUE(cpu.copy->Capture(true).ok());
  ASSERT_TRUE(gpu.copy->Capture(true).ok());
  encode_both(11);
  // An update, as the service would send it (encoded on the host), applied to both copies.
  const auto u = (1e-3 * torch::randn({n})).contiguous();
  std::string bytes(compression::EncodedBytes(spec, size_t(n)), '\0');
  ASSERT_TRUE(compression::Encode(spec, u.data_ptr<float>(), size_t(n),
                                  reinterpret_cast<uint8_t*>(bytes.data()))
                  .ok());
  ASSERT_TRUE(cpu.copy->Apply(spec, 0, uint64_t(n), bytes).ok());
  ASSERT_TRUE(gpu.copy->Apply(spec, 0, uint64_t(n), bytes).ok());
  EXPECT_TRUE(torch::equal(cpu.copy->global(), gpu.copy->global().cpu()));
  // The second round's pseudo-gradient carries the first one's residual.
  ASSERT_TRUE(cpu.copy->Capture(true).ok());
  ASSERT_TRUE(gpu.copy->Capture(true).ok());
  encode_both(12);
  cpu.copy->MergeInto(0.5);
  gpu.copy->MergeInto(0.5);
  EXPECT_TRUE(torch::allclose(cpu.params, gpu.params.cpu(), 1e-6, 1e-7));
}

}  // namespace
}  // namespace atl
