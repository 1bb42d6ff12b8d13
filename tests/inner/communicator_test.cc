// The intra-island collectives over c10d Gloo on loopback, in forked ranks, and what a rank sees
// when a peer dies.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <thread>

#include "inner/parallel/communicator.h"
#include "tests/rank_util.h"

namespace atl::inner::parallel {
namespace {

using std::chrono::milliseconds;

std::unique_ptr<Communicator> Group(const RankInfo& info, milliseconds timeout) {
  auto store = Rendezvous(info, milliseconds(20000));
  if (!store.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", info.rank, store.status().ToString().c_str());
    return nullptr;
  }
  auto comm = Communicator::Create(*store, "world", info.rank, info.world_size, false, timeout);
  if (!comm.ok()) std::fprintf(stderr, "rank %d: %s\n", info.rank, comm.status().ToString().c_str());
  return comm.ok() ? *std::move(comm) : nullptr;
}

TEST(CommunicatorTest, CollectivesOnThreeRanks) {
  const auto codes = testing::RunRanks(3, [](const RankInfo& info) {
    auto c = Group(info, milliseconds(10000));
    if (!c) return 10;
    const int r = info.rank;
    auto t = torch::full({5}, float(r + 1));
    if (!c->AllReduceSum(t).ok() || !torch::equal(t, torch::full({5}, 6.0f))) return 11;
    auto m = torch::full({2}, float(r));
    if (!c->AllReduceMax(m).ok() || m[0].item<float>() != 2.0f) return 12;
    auto shard = torch::full({4}, float(10 * r));
    auto full = torch::empty({12});
    if (!c->AllGather(shard, full).ok()) return 13;
    for (int k = 0; k < 3; ++k) {
      if (full[4 * k].item<float>() != float(10 * k)) return 14;
    }
    auto big = torch::arange(12, torch::kFloat) + float(r);  // rank r adds r everywhere
    auto part = torch::empty({4});
    if (!c->ReduceScatterSum(big, part).ok()) return 15;
    // Elements 4r..4r+3 summed over ranks: 3 * (4r + k) + (0 + 1 + 2).
    for (int k = 0; k < 4; ++k) {
      if (part[k].item<float>() != float(3 * (4 * r + k) + 3)) return 16;
    }
    auto bytes = c->BroadcastBytes(r == 1 ? std::string("from rank one") : std::string(), 1);
    if (!bytes.ok() || *bytes != "from rank one") return 17;
    if (r == 0) {
      if (!c->Send(torch::full({3}, 7.0f), 2, 5).ok()) return 18;
    } else if (r == 2) {
      auto got = torch::zeros({3});
      if (!c->Recv(got, 0, 5).ok() || got[2].item<float>() != 7.0f) return 19;
    }
    return c->Barrier().ok() ? 0 : 20;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
}

// bf16 (which Gloo 1.13 lacks): sums in fp32 (256 + 1 + 1 is 258, which a bf16 accumulator,
// spacing 2 at 256, would round back to 256), gathers bit for bit, a reduce-scatter into an fp32
// shard or a bf16 one.
TEST(CommunicatorTest, Bf16SumsInFp32AndGathersBitForBit) {
  const auto codes = testing::RunRanks(3, [](const RankInfo& info) {
    auto c = Group(info, milliseconds(10000));
    if (!c) return 10;
    const int r = info.rank;
    const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
    auto t = torch::full({4}, r == 0 ? 256.0f : 1.0f, bf16);
    if (!c->AllReduceSum(t).ok() || t.scalar_type() != torch::kBFloat16) return 11;
    if (!torch::equal(t, torch::full({4}, 258.0f, bf16))) return 12;
    auto shard = torch::full({2}, 1.5f + float(r), bf16), full = torch::empty({6}, bf16);
    if (!c->AllGather(shard, full).ok()) return 13;
    for (int k = 0; k < 3; ++k) {
      if (full[2 * k].item<float>() != 1.5f + float(k)) return 14;
    }
    for (const auto shard_type : {torch::kFloat, torch::kBFloat16}) {
      auto big = torch::full({6}, r == 0 ? 256.0f : 1.0f, bf16);
      auto part = torch::empty({2}, torch::TensorOptions().dtype(shard_type));
      if (!c->ReduceScatterSum(big, part).ok()) return 15;
      if (part[0].item<float>() != 258.0f || part[1].item<float>() != 258.0f) return 16;
    }
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
}

// A rank that dies makes its peers' next collective fail within the timeout: no hang.
TEST(CommunicatorTest, ADeadPeerFailsTheCollectiveWithinTheTimeout) {
  const auto codes = testing::RunRanks(2, [](const RankInfo& info) {
    auto c = Group(info, milliseconds(3000));
    if (!c) return 10;
    auto t = torch::ones({4});
    if (!c->AllReduceSum(t).ok()) return 11;
    if (info.rank == 1) _exit(0);  // gone, without a word
    std::this_thread::sleep_for(milliseconds(200));
    const auto t0 = std::chrono::steady_clock::now();
    const auto s = c->AllReduceSum(t);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("after the peer died: %s (%.2f s)\n", s.ToString().c_str(), took);
    if (s.ok() || s.code() != absl::StatusCode::kUnavailable) return 12;
    return took < 6.0 ? 0 : 13;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

}  // namespace
}  // namespace atl::inner::parallel
