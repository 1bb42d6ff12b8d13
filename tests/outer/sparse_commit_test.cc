// Sparse commits (outer/base/fragment_data.h): a round of sparse contributions under a linear step
// commits in time proportional to what it changed, and equals the dense commit bit for bit —
// parameters, optimizer state, hashes, the update every copy applies — over several rounds, relayed
// or as a union, with a sharded island's ranks and error feedback; and a FragmentData whose update
// could leave the floats takes the checked path, and refuses what is not finite.
#include <algorithm>
#include <cstring>
#include <limits>
#include <tuple>

#include "compression/checksum.h"
#include "outer/base/decoded_kept.h"
#include "outer/service/service_options.h"
#include "tests/outer/sync_server_fixture.h"

namespace atl::outer {
namespace {

// 4 of each 256 in int2: 2 islands relay (cheaper than their union), 8 send a union update.
const compression::CodecSpec kSparse = {compression::Codec::kInt2, 256, 4};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class SparseCommitTest : public SyncServerTest {
 protected:
  // A service and its islands: `whole` islands of one rank and island "z" of two ranks
  // (kRank0Ranges, kRank1Ranges), in process, with error feedback.
  struct Run {
    std::unique_ptr<SyncServer> service;
    std::vector<std::unique_ptr<InProcessTransport>> transports;
    std::vector<std::unique_ptr<IslandSync>> ranks;
    std::vector<uint64_t> tokens;
  };
  Run Start(bool sparse_commits, int whole) {
    options_.sparse_commits = sparse_commits;
    options_.num_data_streams = uint32_t(whole + 1);
    options_.codec = kSparse;
    options_.chunk_bytes = 512;  // several chunks per payload and update
    layout_.numels = {1000};
    Run run;
    run.service = Make(Sines(1000));
    IslandSyncOptions so;
    so.codec = kSparse;
    so.error_feedback = true;
    so.error_feedback_decay = 0.8;
    auto add = [&](const std::string& name, std::vector<std::pair<uint64_t, uint64_t>> ranges,
                   uint64_t tokens) {
      so.ranges = std::move(ranges);
      run.transports.push_back(std::make_unique<InProcessTransport>(run.service.get()));
      run.ranks.push_back(
          std::make_unique<IslandSync>(run.transports.back().get(), "run", Id(name), 1000, so));
      run.tokens.push_back(tokens);
      EXPECT_TRUE(run.ranks.back()->FetchGlobal().ok());
    };
    for (int k = 0; k < whole; ++k) {
      const std::string name = absl::StrCat("i", k);
      Join(*run.service, name);
      add(name, {}, 100 + 37 * uint64_t(k));
    }
    Join(*run.service, "z");
    add("z", kRank0Ranges, 90);
    add("z", kRank1Ranges, 90);
    return run;
  }
  // One round: every rank moved by its own made-up local training, all pushing at once.
  static void Round(Run& run, int round) {
    std::vector<absl::StatusOr<RoundOutcome>> out(run.ranks.size());
    std::vector<std::thread> threads;
    for (size_t k = 0; k < run.ranks.size(); ++k) {
      threads.emplace_back([&, k] {
        std::vector<float> local = run.ranks[k]->global();
        for (size_t i = 0; i < local.size(); ++i) {
          local[i] -= 0.02f * std::cos(float(i * (round + 1) + 13 * k)) * float(k % 3 + 1);
        }
        out[k] = run.ranks[k]->SyncRound(local, run.tokens[k]);
      });
    }
    for (auto& t : threads) t.join();
    for (auto& o : out) ASSERT_TRUE(o.ok()) << o.status();
  }
};

TEST_F(SparseCommitTest, EqualsTheDenseCommitBitForBit) {
  struct Case {
    int whole;
    const char* optimizer;  // sgd: every round sparse; nesterov: the warm start's rounds
    bool relayed;
  };
  for (const Case c : {Case{1, "sgd", true}, Case{7, "sgd", false}, Case{1, "nesterov", true},
                       Case{7, "nesterov", false}}) {
    SCOPED_TRACE(absl::StrCat(c.whole + 1, " islands, ", c.optimizer));
    options_.optimizer = {0.7, std::string(c.optimizer) == "sgd" ? 0.0 : 0.9, true};
    options_.optimizer.name = c.optimizer;
    options_.phases.warm_start_steps = 2;  // rounds 0 and 1 average (linear for any optimizer)
    options_.sync_every = 1;
    Run dense = Start(false, c.whole);
    Run sparse = Start(true, c.whole);
    for (int round = 0; round < 5; ++round) {
      SCOPED_TRACE(absl::StrCat("round ", round));
      Round(dense, round);
      Round(sparse, round);
      auto d = dense.service->AwaitRound(uint64_t(round), absl::Now() + absl::Seconds(5), 0);
      auto s = sparse.service->AwaitRound(uint64_t(round), absl::Now() + absl::Seconds(5), 0);
      ASSERT_TRUE(d.ok() && s.ok());
      const bool linear = std::string(c.optimizer) == "sgd" || round < 2;
      if (linear) {
        EXPECT_EQ((*s)->recipe.terms.empty(), !c.relayed);
      }
      ASSERT_TRUE(SameBits(dense.service->params(), sparse.service->params()));
      EXPECT_EQ((*s)->params_hash, (*d)->params_hash);
      EXPECT_EQ((*s)->range_hashes, (*d)->range_hashes);
      EXPECT_EQ((*s)->range_hashes.size(), 5u);  // the whole and the four ranges of "z"'s ranks
      ASSERT_EQ((*s)->update_chunks.size(), (*d)->update_chunks.size());
      for (size_t k = 0; k < (*s)->update_chunks.size(); ++k) {
        EXPECT_EQ((*s)->update_chunks[k].SerializeAsString(),
                  (*d)->update_chunks[k].SerializeAsString());
      }
      EXPECT_EQ((*s)->recipe.terms.size(), (*d)->recipe.terms.size());
      // The hashes kept up to date by the sparse steps are those of the parameters as they are.
      const std::vector<float> p = sparse.service->params();
      EXPECT_EQ((*s)->params_hash, compression::ParamsHash(p.data(), 0, p.size()));
      for (const auto& [range, hash] : (*s)->range_hashes) {
        EXPECT_EQ(hash, compression::ParamsHash(p.data() + range.first, range.first,
                                                range.second - range.first));
      }
      // The norm is a running sum there (within rounding of a fresh one): the islands' shares.
      for (const auto& [island, share] : (*d)->relative_norms) {
        EXPECT_NEAR((*s)->relative_norms.at(island), share, 1e-9 * share) << island;
      }
      for (const auto& rank : sparse.ranks) {
        if (rank->ranges().size() == 1) {
          EXPECT_TRUE(SameBits(rank->global(), p));
        }
      }
    }
    // The optimizer's state (the momentum of rounds after the warm start) is the same too.
    const auto ds = dense.service->optimizer_state(0), ss = sparse.service->optimizer_state(0);
    ASSERT_EQ(ds.size(), ss.size());
    for (size_t k = 0; k < ds.size(); ++k) EXPECT_TRUE(SameBits(ds[k], ss[k]));
  }
}

// 5000 elements (19 codec chunks of 256 and a short one of 136) of a wave, encoded with `spec` as
// two ranks' parts, merged, in chunks of a few codec chunks each.
constexpr uint64_t kMergedElements = 5000;
EncodedPayload TwoRanksMerged(const compression::CodecSpec& spec) {
  const uint64_t n = kMergedElements;
  std::vector<float> g(n);
  for (uint64_t i = 0; i < n; ++i) g[i] = std::sin(0.37f * float(i)) * float(1 + i % 7);
  EncodedPayload encoded;
  encoded.codec = spec;
  for (const auto& [first, last] : {std::pair<uint64_t, uint64_t>{2048, n}, {0, 2048}}) {
    EncodedPayload part;
    part.codec = spec;
    auto chunks = EncodeChunks({"run", "a", 0, 0}, spec, g.data() + first, first, last - first,
                               n, 40);
    EXPECT_TRUE(chunks.ok()) << chunks.status();
    if (!chunks.ok()) return encoded;
    for (auto& c : *chunks) {
      part.chunks.push_back(
          {c.header().offset(), c.header().num_elements(), std::move(*c.mutable_data())});
      part.elements += c.header().num_elements();
    }
    EXPECT_TRUE(encoded.Merge(std::move(part)).ok());
  }
  return encoded;
}

const compression::CodecSpec kKeptSpecs[] = {
    kSparse, compression::CodecSpec{compression::Codec::kFp4E2M1, 256, 9}};

// Measured chunk by chunk as the chunks arrive (ChunkMeter), without a budget: Measure's stats
// bit for bit, nothing kept.
TEST(DecodedKeptTest, AMeterOverTheArrivingChunksMeasuresAsMeasureDoes) {
  for (const compression::CodecSpec& spec : kKeptSpecs) {
    SCOPED_TRACE(compression::SpecText(spec));
    EncodedPayload encoded = TwoRanksMerged(spec);
    ASSERT_GT(encoded.chunks.size(), 4u);
    const auto stats = Measure(encoded);
    ASSERT_TRUE(stats.ok());
    ChunkMeter meter(nullptr);
    for (auto& c : encoded.chunks) ASSERT_TRUE(meter.Add(spec, &c).ok());
    const auto metered = meter.Result();
    ASSERT_TRUE(metered.ok()) << metered.status();
    EXPECT_EQ(std::memcmp(&stats->sum_squares, &metered->sum_squares, sizeof(double)), 0);
    EXPECT_EQ(stats->max_abs, metered->max_abs);
    for (const auto& c : encoded.chunks) EXPECT_EQ(c.kept, nullptr);
  }
}

// A sparse payload's kept values decoded when it is checked (MeasureAndKeep) read exactly as the
// encoded ones: the same visits (bases, offsets, values) over any slice, the same stats; a budget
// too small for every chunk keeps some and decodes the rest; dropped, the leases are returned.
TEST(DecodedKeptTest, ReadAsTheEncodedValuesWithinTheirBudget) {
  const uint64_t n = kMergedElements;
  for (const compression::CodecSpec& spec : kKeptSpecs) {
    SCOPED_TRACE(compression::SpecText(spec));
    const EncodedPayload encoded = TwoRanksMerged(spec);
    ASSERT_GT(encoded.chunks.size(), 4u);
    EncodedPayload kept = encoded;
    KeptBudget budget(uint64_t(1) << 30);
    const auto stats = Measure(encoded);
    const auto kept_stats = MeasureAndKeep(&kept, &budget);
    ASSERT_TRUE(stats.ok() && kept_stats.ok());
    EXPECT_EQ(std::memcmp(&stats->sum_squares, &kept_stats->sum_squares, sizeof(double)), 0);
    EXPECT_EQ(stats->max_abs, kept_stats->max_abs);
    for (const auto& c : kept.chunks) ASSERT_NE(c.kept, nullptr);
    EXPECT_GT(budget.in_use(), 0u);
    EXPECT_EQ(budget.in_use(), budget.bytes());
    auto visits = [](const EncodedPayload& p, uint64_t first, uint64_t count) {
      std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> out;  // base, offset, value bits
      EXPECT_TRUE(p.VisitKept(first, count, [&](uint64_t base, const uint32_t* index,
                                                const float* value, size_t m) {
                    for (size_t j = 0; j < m; ++j) {
                      uint32_t bits;
                      std::memcpy(&bits, &value[j], 4);
                      out.emplace_back(base, index[j], bits);
                    }
                  }).ok());
      return out;
    };
    for (const auto& [first, count] : std::vector<std::pair<uint64_t, uint64_t>>{
             {0, n}, {1, n - 1}, {0, 1}, {255, 2}, {300, 1700}, {2047, 2}, {4900, 100}, {4999, 1}}) {
      SCOPED_TRACE(absl::StrCat("[", first, ", ", first + count, ")"));
      const auto want = visits(encoded, first, count);
      EXPECT_EQ(visits(kept, first, count), want);
      if (count == n) {
        EXPECT_GT(want.size(), 19u * spec.topk);
      }
    }
    // Room for a chunk or two: the rest is decoded on each read, to the same values.
    KeptBudget small(budget.bytes() / kept.chunks.size() * 2);
    EncodedPayload some = encoded;
    ASSERT_TRUE(MeasureAndKeep(&some, &small).ok());
    const size_t held = size_t(std::count_if(some.chunks.begin(), some.chunks.end(),
                                             [](const EncodedChunk& c) { return c.kept != nullptr; }));
    EXPECT_GE(held, 1u);
    EXPECT_LT(held, some.chunks.size());
    EXPECT_EQ(visits(some, 0, n), visits(encoded, 0, n));
    some.DropKept();
    EXPECT_EQ(small.in_use(), 0u);
    EXPECT_LE(small.bytes(), budget.bytes() / kept.chunks.size() * 2);
    // Dropped, the storage is kept for the next payload, which fits in it.
    const uint64_t bytes = budget.bytes();
    kept = EncodedPayload();
    EXPECT_EQ(budget.in_use(), 0u);
    EXPECT_EQ(budget.bytes(), bytes);
    EncodedPayload again = encoded;
    ASSERT_TRUE(MeasureAndKeep(&again, &budget).ok());
    EXPECT_EQ(budget.bytes(), bytes);
    EXPECT_EQ(visits(again, 0, n), visits(encoded, 0, n));
  }
}

// A sparse push whose kept values decode to a non-finite value (a chunk's int2 step made
// infinite, the checksum redone) is refused at its end, naming the island, and leaves the round
// as it was; a good push then counts.
TEST_F(SparseCommitTest, ASparsePushThatDecodesNonFiniteIsRefusedAtItsEnd) {
  options_.codec = kSparse;
  options_.num_data_streams = 2;
  layout_.numels = {1000};
  auto service = Make(Sines(1000));
  Join(*service, "a");
  Join(*service, "b");
  std::vector<float> delta = Sines(1000);
  auto push = [&](bool broken) {
    auto chunks = *EncodeChunks({"run", "a", 0, 0}, kSparse, delta.data(), 0, 1000, 1000, 16);
    EXPECT_GT(chunks.size(), 2u);
    if (broken) {  // the second chunk's first codec block: its step is the first 4 bytes
      std::string* data = chunks[1].mutable_data();
      const float inf = std::numeric_limits<float>::infinity();
      std::memcpy(data->data(), &inf, sizeof(inf));
      chunks[1].set_xxh64(compression::Checksum(data->data(), data->size()));
    }
    std::vector<pb::PushRequest> requests(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      *requests[i].mutable_chunk() = chunks[i];
      requests[i].set_tokens(10);
    }
    requests[0].set_session(sessions_["a"]);
    return service->Push(requests);
  };
  auto refused = push(true);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("contribution of island 'a' to round 0: "));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("non-finite"));
  auto counted = push(false);
  ASSERT_TRUE(counted.ok()) << counted.status();
  EXPECT_EQ(counted->contributors(), 1u);  // the refused push left nothing behind
}

// Parameters near the largest float: the one-pass step cannot vouch for the result, so the update
// is checked element by element first; one that would overflow is refused with nothing changed.
TEST(FragmentDataTest, SparseStepsNearTheLargestFloatAreCheckedFirst) {
  OuterOptimizerConfig sgd{1.0, 0.0, false};
  sgd.name = "sgd";
  std::vector<float> init(4096, 1.0f);
  init[7] = 3.0e38f;
  FragmentData dense(init, sgd), sparse(init, sgd);
  SparseGradient g;
  g.Reset(2);
  g.pieces[0] = {{3, 7}, {0.5f, 1.0e37f}};
  g.pieces[1] = {{4000}, {-2.0f}};
  std::vector<float> flat(4096, 0.0f);
  flat[3] = 0.5f;
  flat[7] = 1.0e37f;
  flat[4000] = -2.0f;
  const compression::CodecSpec codec{compression::Codec::kInt2, 256, 4};
  const PayloadId id{"run", "", 0, 0};
  auto update = dense.PrepareUpdate(flat.data(), id, codec, 512, nullptr);
  ASSERT_TRUE(update.ok()) << update.status();
  dense.Apply(flat.data(), *update, nullptr);
  FragmentData::SparseUpdate scratch;
  auto chunks = sparse.StepSparse(g, id, codec, 512, nullptr, &scratch);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  EXPECT_TRUE(SameBits(dense.params(), sparse.params()));
  EXPECT_EQ(dense.Hash(), sparse.Hash());
  ASSERT_EQ(chunks->size(), update->size());
  for (size_t k = 0; k < chunks->size(); ++k) {
    EXPECT_EQ((*chunks)[k].SerializeAsString(), (*update)[k].SerializeAsString());
  }
  // -3e38 more would overflow element 7: refused, nothing changed.
  const std::vector<float> before = sparse.params();
  const uint64_t hash = sparse.Hash();
  g.pieces[0].value[1] = -3.0e38f;
  auto refused = sparse.StepSparse(g, id, codec, 512, nullptr, &scratch);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("non-finite"));
  EXPECT_TRUE(SameBits(sparse.params(), before));
  EXPECT_EQ(sparse.Hash(), hash);
  EXPECT_EQ(sparse.StepLinearSparse(g, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SameBits(sparse.params(), before));
}

// An update encoded into the buffers of a retired one (SpareChunkData: longer, shorter or empty,
// full of other bytes) is the update encoded into fresh ones, byte for byte: dense and sparse.
TEST(FragmentDataTest, UpdatesEncodedIntoSpareBuffersEqualFreshOnes) {
  const uint64_t n = 5000;
  std::vector<float> init(n), flat(n, 0.0f);
  for (uint64_t i = 0; i < n; ++i) init[i] = std::sin(float(i));
  SparseGradient g;
  g.Reset(2, 4096);
  for (uint64_t i = 0; i < n; i += 7) {
    const float v = 1e-2f * std::cos(float(i));
    flat[i] = v;
    g.pieces[i / 4096].index.push_back(i);
    g.pieces[i / 4096].value.push_back(v);
  }
  auto dirty = [] {
    SpareChunkData spare;
    for (size_t size : {3000, 10, 0, 700, 512, 100000}) {
      spare.buffers.push_back(std::string(size, '\xff'));
    }
    return spare;
  };
  auto same = [](const std::vector<pb::Chunk>& a, const std::vector<pb::Chunk>& b) {
    ASSERT_EQ(a.size(), b.size());
    ASSERT_GT(a.size(), 4u);  // some chunks have no spare buffer
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_EQ(a[k].SerializeAsString(), b[k].SerializeAsString()) << k;
    }
  };
  const PayloadId id{"run", "", 0, 0};
  OuterOptimizerConfig nesterov{0.7, 0.9, true};
  nesterov.name = "nesterov";
  const FragmentData dense(init, nesterov);
  SpareChunkData spare = dirty();
  const compression::CodecSpec fp4{compression::Codec::kFp4E2M1, 32, 0};
  auto fresh = dense.PrepareUpdate(flat.data(), id, fp4, 512, nullptr);
  auto reused = dense.PrepareUpdate(flat.data(), id, fp4, 512, nullptr, &spare);
  ASSERT_TRUE(fresh.ok() && reused.ok());
  same(*fresh, *reused);
  OuterOptimizerConfig sgd{0.7, 0.0, false};
  sgd.name = "sgd";
  FragmentData a(init, sgd), b(init, sgd);
  FragmentData::SparseUpdate scratch;
  spare = dirty();
  const compression::CodecSpec codec{compression::Codec::kInt2, 256, 4};
  auto fresh_sparse = a.StepSparse(g, id, codec, 64, nullptr, &scratch);
  auto reused_sparse = b.StepSparse(g, id, codec, 64, nullptr, &scratch, &spare);
  ASSERT_TRUE(fresh_sparse.ok() && reused_sparse.ok());
  same(*fresh_sparse, *reused_sparse);
  EXPECT_TRUE(SameBits(a.params(), b.params()));
  EXPECT_EQ(a.Hash(), b.Hash());
}

// Buffers of payloads done with are lent to chunk data without storage of its own, within the
// pool's bound; written buffers come in the sizes asked for.
TEST(BufferPoolTest, LendsRecycledBuffersWithinItsBound) {
  BufferPool pool(2500);
  std::vector<EncodedChunk> chunks(3);
  for (auto& c : chunks) {
    c.data.reserve(1000);
    c.data.assign(999, 'x');
  }
  const size_t capacity = chunks[0].data.capacity();
  ASSERT_GE(capacity, 1000u);
  ASSERT_LE(2 * capacity, 2500u);
  pool.Recycle(chunks);
  EXPECT_EQ(pool.bytes(), 2 * capacity);  // the third would pass the bound: its chunk keeps it
  EXPECT_EQ(chunks[2].data.size(), 999u);
  std::string own;
  own.reserve(4000);
  pool.Lend(&own);  // has storage of its own
  EXPECT_EQ(pool.bytes(), 2 * capacity);
  std::string empty, other, none;
  pool.Lend(&empty);
  pool.Lend(&other);
  pool.Lend(&none);  // nothing left
  EXPECT_EQ(pool.bytes(), 0u);
  for (const std::string* s : {&empty, &other}) {
    EXPECT_TRUE(s->empty());
    EXPECT_EQ(s->capacity(), capacity);
  }
  EXPECT_LT(none.capacity(), 1000u);
  const auto written = WrittenBuffers({0, 17, 300000});
  ASSERT_EQ(written.size(), 3u);
  EXPECT_EQ(written[0].size(), 0u);
  EXPECT_EQ(written[1].size(), 17u);
  EXPECT_EQ(written[2].size(), 300000u);
}

// outer.service_threads = 0 (the default) gives the service the cores it may use: the CPU affinity
// and, under a cgroup quota, the quota's cores rounded up.
TEST(ServiceThreadsTest, AutoUsesTheCoresTheServiceMayUse) {
  EXPECT_EQ(CoresFromCpuMax("max 100000\n", 16), 16);
  EXPECT_EQ(CoresFromCpuMax("150000 100000\n", 16), 2);
  EXPECT_EQ(CoresFromCpuMax("50000 100000", 16), 1);
  EXPECT_EQ(CoresFromCpuMax("6400000 100000", 16), 16);  // at most the affinity's
  EXPECT_EQ(CoresFromCpuMax("", 8), 8);
  EXPECT_EQ(CoresFromCpuMax("lots 100000", 8), 8);
  const int cores = UsableCores();
  EXPECT_GE(cores, 1);
  EXPECT_LE(cores, int(std::max(1u, std::thread::hardware_concurrency())));
  OuterConfig outer;
  EXPECT_EQ(outer.service_threads, 0);
  EXPECT_EQ(ServiceOptions(outer, {}).service_threads, cores);
  outer.service_threads = 3;
  EXPECT_EQ(ServiceOptions(outer, {}).service_threads, 3);
}

}  // namespace
}  // namespace atl::outer
