// Copies (outer/base/copies.h): an island that sends another's contribution, as it is or scaled,
// is found with that island (sparse: shared kept indices; dense: cosine), and the two weigh as
// one; honest contributions are left alone. Through the service: the round's record names them,
// the fold uses their divided tokens, and every copy of the parameters stays bit-identical.
#include <cmath>
#include <cstring>

#include "compression/codec_math.h"
#include "outer/base/aggregation.h"
#include "outer/base/copies.h"
#include "tests/outer/sync_server_fixture.h"

namespace atl::outer {
namespace {

EncodedPayload EncodedWith(const compression::CodecSpec& spec, const std::vector<float>& v) {
  ChunkStream stream({"run", "x", 0, 0}, spec, v.size());
  auto chunks = EncodeChunks({"run", "x", 0, 0}, spec, v.data(), 0, v.size(), v.size(), 4096);
  EXPECT_TRUE(chunks.ok()) << chunks.status();
  for (auto& c : *chunks) EXPECT_TRUE(stream.Add(std::move(c)).ok());
  return std::move(stream).Take();
}

// Independent pseudo-random values in [-1, 1) per seed.
std::vector<float> Noise(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 2 * compression::math::Uniform(seed, i) - 1;
  return v;
}

TEST(CopiesTest, ACopiedOrScaledContributionWeighsAsOneWithItsSource) {
  const uint64_t n = 300000;  // 74 windows: 64 of them sampled
  for (const compression::CodecSpec spec :
       {compression::CodecSpec{compression::Codec::kInt2, 4096, 123},  // sparse 3%
        compression::CodecSpec{compression::Codec::kFp4E2M1, 32, 0}}) {
    SCOPED_TRACE(compression::SpecText(spec));
    // a, b, d train; c sends a's contribution, e sends b's at half scale.
    const std::vector<float> a = Noise(n, 1), b = Noise(n, 2), d = Noise(n, 4);
    std::vector<float> e = b;
    for (float& x : e) x *= 0.5f;
    std::vector<EncodedPayload> payloads = {EncodedWith(spec, a), EncodedWith(spec, b),
                                            EncodedWith(spec, a), EncodedWith(spec, d),
                                            EncodedWith(spec, e)};
    std::vector<ContributionRef> refs;
    for (size_t i = 0; i < payloads.size(); ++i) {
      refs.push_back({std::string(1, char('a' + i)), 1000 + i, 1.0, &payloads[i]});
    }
    CopyOptions on;
    on.overlap = 0.9;
    on.cosine = 0.99;
    std::vector<ContributionRef> honest = {refs[0], refs[1], refs[3]};
    CopyReport clean;
    WeighCopies(on, honest, n, 7, &clean);
    EXPECT_TRUE(clean.groups.empty());
    EXPECT_LT(clean.most_similar, 0.2);  // independent: about the density, or a cosine near 0
    for (size_t i = 0; i < honest.size(); ++i) EXPECT_EQ(honest[i].tokens, refs[i == 2 ? 3 : i].tokens);

    CopyReport report;
    WeighCopies(on, refs, n, 7, &report);
    ASSERT_EQ(report.groups.size(), 2u);
    EXPECT_EQ(report.groups[0], (std::vector<std::string>{"a", "c"}));
    EXPECT_EQ(report.groups[1], (std::vector<std::string>{"b", "e"}));
    EXPECT_DOUBLE_EQ(report.most_similar, 1.0);
    EXPECT_EQ(refs[0].tokens, 500u);
    EXPECT_EQ(refs[2].tokens, 501u);
    EXPECT_EQ(refs[1].tokens, 500u);
    EXPECT_EQ(refs[4].tokens, 502u);
    EXPECT_EQ(refs[3].tokens, 1003u);  // d alone keeps its weight

    // Off (the default): nothing found, nothing changed.
    const CopyOptions off;
    std::vector<ContributionRef> again;
    for (size_t i = 0; i < payloads.size(); ++i) {
      again.push_back({std::string(1, char('a' + i)), 1000 + i, 1.0, &payloads[i]});
    }
    CopyReport none;
    WeighCopies(off, again, n, 7, &none);
    EXPECT_TRUE(none.groups.empty());
    EXPECT_EQ(again[2].tokens, 1002u);
  }
}

// Through the service: island "c" pushes what "a" pushes. The record names them, the parameters
// are the token-weighted mean with their tokens halved, and every island's copy equals the
// service's bit for bit.
TEST_F(SyncServerTest, ACopyingIslandWeighsAsOneWithTheIslandItCopies) {
  const size_t n = 20000;
  options_.num_data_streams = 3;
  options_.optimizer = {1.0, 0.0, false};
  options_.optimizer.name = "sgd";
  options_.aggregation.copies.cosine = 0.99;
  layout_.numels = {n};
  auto s = Make(std::vector<float>(n, 0.0f));
  std::vector<std::unique_ptr<InProcessTransport>> transports;
  std::vector<std::unique_ptr<IslandSync>> islands;
  for (const char* name : {"a", "b", "c"}) {
    Join(*s, name);
    transports.push_back(std::make_unique<InProcessTransport>(s.get()));
    islands.push_back(
        std::make_unique<IslandSync>(transports.back().get(), "run", Id(name), n, IslandSyncOptions()));
    ASSERT_TRUE(islands.back()->FetchGlobal().ok());
  }
  const std::vector<float> delta_a = Noise(n, 11), delta_b = Noise(n, 12);
  const uint64_t tokens[] = {100, 300, 100};
  std::vector<absl::StatusOr<RoundOutcome>> out(3);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < 3; ++k) {
    threads.emplace_back([&, k] {
      std::vector<float> local = islands[k]->global();
      const auto& delta = k == 1 ? delta_b : delta_a;  // c copies a
      for (size_t i = 0; i < n; ++i) local[i] -= delta[i];
      out[k] = islands[k]->SyncRound(local, tokens[k]);
    });
  }
  for (auto& t : threads) t.join();
  for (auto& o : out) ASSERT_TRUE(o.ok()) << o.status();
  auto committed = s->AwaitRound(0, absl::Now() + absl::Seconds(5), 0);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ((*committed)->aggregation.copies.groups,
            (std::vector<std::vector<std::string>>{{"a", "c"}}));
  // The fold by hand, with a's and c's tokens halved (fp32 contributions: exact).
  const std::vector<float> p = s->params();
  for (size_t i = 0; i < n; ++i) {
    double sum = 50.0 * double(delta_a[i]) + 300.0 * double(delta_b[i]) + 50.0 * double(delta_a[i]);
    ASSERT_EQ(p[i], 0.0f - float(sum / 400.0)) << i;
  }
  for (auto& island : islands) EXPECT_EQ(std::memcmp(island->global().data(), p.data(), n * 4), 0);
}

}  // namespace
}  // namespace atl::outer
