// Relayed updates (outer/base/update_recipe.h): with a linear outer step and sparse contributions the
// service relays the contributions and every copy makes u itself, bit for bit the service's; a
// rank that pushed receives only the other islands'. The fold over a range, recipe refusals, the
// receiver's refusals, ranks and lanes, and the bytes an island receives.
#include "outer/base/update_recipe.h"

#include "tests/outer/sync_server_fixture.h"

namespace atl::outer {
namespace {

// 4 of each 256 in int2: small enough that relaying two islands' beats their union in FP4.
const compression::CodecSpec kSparse = {compression::Codec::kInt2, 256, 4};

// Sparse int2 contributions of `m` islands over n elements, encoded as a push is.
std::vector<EncodedPayload> SparsePayloads(size_t m, uint64_t n) {
  std::vector<EncodedPayload> out(m);
  for (size_t k = 0; k < m; ++k) {
    std::vector<float> delta(n);
    for (uint64_t i = 0; i < n; ++i) delta[i] = std::sin(float(i * (k + 2) + k)) * float(k + 1);
    auto chunks = *EncodeChunks({"run", absl::StrCat("i", k), 0, 0}, kSparse, delta.data(), 0, n,
                                n, 256);
    out[k].codec = kSparse;
    for (auto& c : chunks) {
      out[k].chunks.push_back({c.header().offset(), c.header().num_elements(), c.data()});
      out[k].elements += c.header().num_elements();
    }
  }
  return out;
}

// The fold of a range holds the bits the whole fragment's aggregate holds there, for the mean and
// for clipped_mean (whose scales a recipe carries).
TEST(RelayTest, CombineMeanOfARangeIsTheWholeFoldThere) {
  const uint64_t n = 1000;
  const auto payloads = SparsePayloads(3, n);
  for (AggregationRule rule : {AggregationRule::kMean, AggregationRule::kClippedMean}) {
    SCOPED_TRACE(AggregationRuleName(rule));
    std::vector<ContributionRef> refs;
    for (size_t k = 0; k < payloads.size(); ++k) {
      const double norm = std::sqrt(Measure(payloads[k])->sum_squares);
      refs.push_back({absl::StrCat("i", k), 10 + 7 * k, norm, &payloads[k]});
    }
    AggregationOptions options;
    options.rule = rule;
    options.clip_multiple = 1.0;  // the largest of three is clipped to the median
    std::vector<float> whole(n);
    AggregationReport report;
    ASSERT_TRUE(Aggregate(options, refs, n, whole.data(), &report).ok());
    ASSERT_EQ(report.scales.size(), 3u);
    if (rule == AggregationRule::kClippedMean) {
      EXPECT_LT(report.scales[2], 1.0);
    }
    for (const auto& [first, count] : std::vector<std::pair<uint64_t, uint64_t>>{
             {0, n}, {64, 576}, {100, 233}, {999, 1}}) {
      std::vector<float> part(count);
      ASSERT_TRUE(CombineMean(refs, report.scales, first, count, part.data()).ok());
      EXPECT_EQ(part, std::vector<float>(whole.begin() + int64_t(first),
                                         whole.begin() + int64_t(first + count)))
          << "[" << first << ", " << first + count << ")";
    }
  }
}

TEST(RelayTest, RecipesAreCheckedByName) {
  auto refused = [](const pb::UpdateRecipe& r, const char* what) {
    auto got = RecipeOf(r);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(what));
  };
  pb::UpdateRecipe ok;
  ok.set_lr(2.25f);
  for (const char* island : {"a", "b"}) {
    auto* t = ok.add_terms();
    t->set_island_id(island);
    t->set_tokens(100);
    t->set_scale(1.0);
  }
  auto parsed = RecipeOf(ok);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->terms.size(), 2u);
  EXPECT_EQ(parsed->lr, 2.25f);
  refused(pb::UpdateRecipe(), "0 terms");
  auto twice = ok;
  twice.mutable_terms(1)->set_island_id("a");
  refused(twice, "names island 'a' twice");
  auto no_tokens = ok;
  no_tokens.mutable_terms(0)->set_tokens(0);
  refused(no_tokens, "by 0 tokens");
  auto scaled = ok;
  scaled.mutable_terms(1)->set_scale(1.5);
  refused(scaled, "not in [0, 1]");
  auto nan = ok;
  nan.set_lr(std::nanf(""));
  refused(nan, "learning rate is not finite");
  auto bad_name = ok;
  bad_name.mutable_terms(0)->set_island_id("a\nb");
  refused(bad_name, "island");
  pb::UpdateRecipe many;
  for (size_t i = 0; i <= kMaxRecipeTerms; ++i) many.add_terms()->set_island_id("x");
  refused(many, "4097 terms");
}

TEST(RelayTest, OnlySparseContributionsAreRelayedWhenThatIsSmaller) {
  const uint64_t n = 4096 * 64;
  const compression::CodecSpec top1 = {compression::Codec::kInt2, 4096, 41};
  EXPECT_TRUE(RelayIsSmaller(top1, 1, n));
  EXPECT_TRUE(RelayIsSmaller(top1, 2, n));
  EXPECT_FALSE(RelayIsSmaller({compression::Codec::kFp4E2M1, 32}, 2, n));  // dense
  // Many islands: their union saturates at dense FP4, while relaying grows with M.
  EXPECT_FALSE(RelayIsSmaller(top1, 64, n));
  // An island of a pair receives one push instead of the union of both.
  EXPECT_EQ(DownBytesAtMost(top1, 2, n, true), compression::EncodedBytes(top1, n));
  EXPECT_EQ(DownBytesAtMost(top1, 2, n, false), UpdateBytesAtMost(top1, 2, n));
  EXPECT_LT(DownBytesAtMost(top1, 2, n, true), UpdateBytesAtMost(top1, 2, n) * 6 / 10);
}

// Three islands, outer SGD at lr 2: every copy equals the service's, which equals
// theta - lr x (token-weighted mean of the decoded contributions) computed here; each island
// receives the two others' contributions, about twice what it sent.
TEST_F(SyncServerTest, RelayedUpdatesCarryTheOtherIslandsContributions) {
  const compression::CodecSpec top8 = {compression::Codec::kInt2, 1024, 8};
  options_.optimizer = {2.0, 0.0, false};
  options_.optimizer.name = "sgd";
  options_.num_data_streams = 3;
  options_.codec = top8;
  layout_.numels = {1000};
  auto s = Make(Sines(1000));
  std::vector<std::unique_ptr<InProcessTransport>> transports;
  std::vector<std::unique_ptr<IslandSync>> islands;
  IslandSyncOptions so;
  so.codec = top8;
  so.error_feedback = true;
  for (const char* name : {"a", "b", "c"}) {
    Join(*s, name);
    transports.push_back(std::make_unique<InProcessTransport>(s.get()));
    islands.push_back(std::make_unique<IslandSync>(transports.back().get(), "run", Id(name), 1000, so));
    ASSERT_TRUE(islands.back()->FetchGlobal().ok());
  }
  for (int round = 0; round < 4; ++round) {
    const std::vector<float> before = s->params();
    std::vector<std::vector<float>> locals;
    for (size_t k = 0; k < 3; ++k) {
      locals.push_back(islands[k]->global());
      for (size_t i = 0; i < 1000; ++i) locals[k][i] -= 0.01f * std::cos(float(i * (round + k + 1)));
    }
    std::vector<absl::StatusOr<RoundOutcome>> out(3);
    std::vector<std::thread> threads;
    for (size_t k = 0; k < 3; ++k) {
      threads.emplace_back([&, k] { out[k] = islands[k]->SyncRound(locals[k], 100 * (k + 1)); });
    }
    for (auto& t : threads) t.join();
    for (size_t k = 0; k < 3; ++k) {
      ASSERT_TRUE(out[k].ok()) << out[k].status();
      EXPECT_FALSE(out[k]->resynced);
      EXPECT_EQ(islands[k]->global(), s->params());
      EXPECT_GT(out[k]->bytes_received, out[k]->bytes_sent);
      EXPECT_LT(out[k]->bytes_received, 3 * out[k]->bytes_sent);
    }
    auto committed = s->AwaitRound(uint64_t(round), absl::Now() + absl::Seconds(5), 0);
    ASSERT_TRUE(committed.ok()) << committed.status();
    ASSERT_EQ((*committed)->recipe.terms.size(), 3u);
    EXPECT_TRUE((*committed)->update_chunks.empty());
    // The update by hand: the same decoded contributions, weighted by tokens, stepped by lr.
    std::vector<double> sum(1000, 0.0);
    std::vector<float> d(1000);
    for (size_t k = 0; k < 3; ++k) {
      ASSERT_TRUE((*committed)->relayed[k]->Read(0, 1000, d.data()).ok());
      for (size_t i = 0; i < 1000; ++i) sum[i] += double(100 * (k + 1)) * double(d[i]);
    }
    size_t moved = 0;
    for (size_t i = 0; i < 1000; ++i) {
      const float u = 2.0f * float(sum[i] / 600.0);
      ASSERT_EQ(s->params()[i], before[i] - u) << "round " << round << " element " << i;
      moved += u != 0.0f;
    }
    EXPECT_LE(moved, 3 * 8u);  // at most the union of 3 x 8 (one chunk)
  }
}

// A sharded island's ranks, the lanes of several connections, dropped and corrupted calls: each
// receives its part of the relay and leaves out only what it pushed itself; every copy ends equal
// to the service's, the same with one connection or three, with faults or without.
TEST_F(SyncServerTest, RelayedUpdatesReachEveryRankAndLane) {
  options_.optimizer = {1.5, 0.0, false};
  options_.num_data_streams = 2;
  options_.codec = kSparse;
  layout_.numels = {1000};
  const std::vector<float> init = Sines(1000);
  auto run = [&](int connections, double faults) {
    SCOPED_TRACE(absl::StrCat(connections, " connections, faults ", faults));
    std::vector<std::vector<float>> trace;
    auto s = Make(init);
    InProcessTransport t0(s.get(), absl::Seconds(60), connections);
    IslandSyncOptions so;
    so.codec = kSparse;
    so.chunk_bytes = 64;
    ThreeRanks t = JoinThreeRanks(*s, &t0, faults, so);
    for (int round = 0; round < 4; ++round) {
      auto ra = SyncThree(t, round);
      EXPECT_TRUE(ra.ok()) << ra.status();
      if (!ra.ok()) return trace;
      auto committed = s->AwaitRound(uint64_t(round), absl::Now() + absl::Seconds(5), 0);
      EXPECT_TRUE(committed.ok() && (*committed)->recipe.terms.size() == 2u);
      EXPECT_EQ(t.a->global(), s->params());
      for (const IslandSync* rank : {t.b0.get(), t.b1.get()}) {
        size_t at = 0;
        for (const auto& [begin, end] : rank->ranges()) {
          for (uint64_t i = begin; i < end; ++i, ++at) EXPECT_EQ(rank->global()[at], s->params()[i]);
        }
      }
      if (faults == 0) {
        // One island's contribution each way, give or take headers and the recipe.
        EXPECT_LT(ra->bytes_received, 2 * ra->bytes_sent + 1024);
      }
      trace.push_back(s->params());
    }
    if (faults > 0) {
      EXPECT_GT(t.dropped(), 0u);
    }
    return trace;
  };
  const auto one = run(1, 0);
  ASSERT_EQ(one.size(), 4u);
  EXPECT_EQ(run(3, 0), one);
  EXPECT_EQ(run(3, 0.1), one);
}

// What the receiver refuses, by name: a chunk of an island the recipe does not name, the
// island's own contribution when it holds it, a recipe that changes, a term it never got.
TEST_F(SyncServerTest, ARelayReceiverRefusesWhatDoesNotFitTheRecipe) {
  options_.optimizer = {1.0, 0.0, false};
  options_.num_data_streams = 2;
  options_.codec = kSparse;
  layout_.numels = {256};
  auto s = Make(Sines(256));
  InProcessTransport t1(s.get()), t2(s.get());
  Join(*s, "a");
  Join(*s, "b");
  IslandSyncOptions so;
  so.codec = kSparse;
  IslandSync a(&t1, "run", Id("a"), 256, so), b(&t2, "run", Id("b"), 256, so);
  ASSERT_TRUE(a.FetchGlobal().ok() && b.FetchGlobal().ok());
  auto [ra, rb] = SyncBoth(a, b, 0);
  ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
  // Round 0's whole relay, as an island that holds nothing of its own receives it.
  pb::UpdateRequest request;
  request.set_run_id("run");
  request.set_island_id("a");
  request.set_session(sessions_["a"]);
  std::vector<pb::UpdateChunk> messages;
  ASSERT_TRUE(StreamUpdate(*s, request, absl::Now() + absl::Seconds(5), nullptr,
                           [&](pb::UpdateChunk&& c) {
                             messages.push_back(std::move(c));
                             return true;
                           })
                  .ok());
  ASSERT_GE(messages.size(), 2u);
  const PayloadId id{"run", "a", 0, 0};
  auto receive = [&](std::vector<pb::UpdateChunk> got, const EncodedPayload* own) {
    RelayReceiver r(id, kSparse, 256, 0, 256, own);
    for (auto& m : got) {
      if (auto s = r.Add(std::move(m)); !s.ok()) return s;
    }
    return r.Finish().status();
  };
  EXPECT_TRUE(receive(messages, nullptr).ok());
  {
    auto got = messages;
    got.back().mutable_chunk()->mutable_header()->set_island_id("c");
    auto st = receive(got, nullptr);
    EXPECT_THAT(std::string(st.message()), HasSubstr("which its recipe does not name"));
  }
  {
    auto got = messages;
    got.back().mutable_recipe()->set_lr(3.0f);
    EXPECT_THAT(std::string(receive(got, nullptr).message()), HasSubstr("disagree on its recipe"));
  }
  {
    std::vector<pb::UpdateChunk> got;
    for (const auto& m : messages) {
      if (m.chunk().header().island_id() != "b") got.push_back(m);
    }
    EXPECT_THAT(std::string(receive(got, nullptr).message()),
                HasSubstr("0 of 0 chunks of island 'b', which its recipe names"));
  }
  {
    EncodedPayload own;
    own.codec = kSparse;
    auto st = receive(messages, &own);
    EXPECT_THAT(std::string(st.message()), HasSubstr("own contribution, which it holds"));
  }
  {
    auto got = messages;
    got.back().mutable_chunk()->set_xxh64(got.back().chunk().xxh64() ^ 1);
    EXPECT_EQ(receive(got, nullptr).code(), absl::StatusCode::kDataLoss);
  }
}

}  // namespace
}  // namespace atl::outer
