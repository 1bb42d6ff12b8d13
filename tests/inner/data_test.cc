#include "inner/data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "tests/test_util.h"

namespace atl::inner {
namespace {

using ::atl::testing::TempDir;
using ::testing::HasSubstr;

std::vector<uint16_t> Iota(size_t n, uint16_t mod) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = uint16_t(i % mod);
  return t;
}

TEST(DataTest, TextIsByteTokens) {
  TempDir dir;
  testing::WriteFile(dir.Join("a.txt"), "hello \xc3\xa9");
  auto corpus = TokenCorpus::Load(dir.Join("a.txt"), 256);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  ASSERT_EQ((*corpus)->num_tokens(), 8u);
  EXPECT_EQ((*(*corpus)->segments()[0])[6], 0xc3u);
  EXPECT_TRUE((*corpus)->is_text());
}

TEST(DataTest, DirectoryConcatenatesFilesInNameOrder) {
  TempDir dir;
  testing::WriteFile(dir.Join("b.txt"), "BBBB");
  testing::WriteFile(dir.Join("a.txt"), "AA");
  testing::WriteFile(dir.Join(".hidden"), "zzz");
  auto corpus = TokenCorpus::Load(dir.path(), 256);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  const auto& t = *(*corpus)->segments()[0];
  ASSERT_EQ((*corpus)->num_tokens(), 6u);
  EXPECT_EQ(t[0], uint32_t('A'));
  EXPECT_EQ(t[2], uint32_t('B'));
}

TEST(DataTest, ShardRoundTripAndGlob) {
  TempDir dir;
  ASSERT_TRUE(WriteShard(dir.Join("s0.bin"), Iota(1000, 700)).ok());
  ASSERT_TRUE(WriteShard(dir.Join("s1.bin"), Iota(500, 50)).ok());
  auto corpus = TokenCorpus::Load(dir.Join("s*.bin"), 1024);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  ASSERT_EQ((*corpus)->segments().size(), 2u);
  EXPECT_EQ((*corpus)->num_tokens(), 1500u);
  EXPECT_EQ((*(*corpus)->segments()[0])[699], 699u);
  EXPECT_EQ((*corpus)->segments()[0]->width(), 2);
  EXPECT_FALSE((*corpus)->is_text());
}

TEST(DataTest, Uint32ShardsHoldVocabulariesPast65536) {
  TempDir dir;
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 128255, 7};
  ASSERT_TRUE(WriteShard32(dir.Join("big.bin"), tokens).ok());
  // llm.c's Llama 3 header: magic 20240801, version 7, the count; then 4-byte tokens.
  std::ifstream in(dir.Join("big.bin"), std::ios::binary);
  int32_t header[3];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  EXPECT_EQ(header[0], 20240801);
  EXPECT_EQ(header[1], 7);
  EXPECT_EQ(header[2], 5);
  auto corpus = TokenCorpus::Load(dir.Join("big.bin"), 128256);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  const auto& segment = *(*corpus)->segments()[0];
  EXPECT_EQ(segment.width(), 4);
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(segment[i], tokens[i]);
  // A token past the model's vocabulary is refused with where it is.
  EXPECT_THAT(std::string(TokenCorpus::Load(dir.Join("big.bin"), 100000).status().message()),
              HasSubstr("token 128255 at position 3"));
  // A uint16 shard cannot hold it.
  auto narrow = ShardWriter::Open(dir.Join("narrow.bin"), 2);
  ASSERT_TRUE(narrow.ok());
  EXPECT_THAT(std::string((*narrow)->Append(tokens.data(), tokens.size()).message()),
              HasSubstr("token 65536 does not fit a uint16 shard"));
  EXPECT_EQ(ShardWidth(65536), 2);
  EXPECT_EQ(ShardWidth(65537), 4);
}

TEST(DataTest, AShardWriterStreamsPastItsBufferAndWritesTheCountOnClose) {
  TempDir dir;
  auto writer = ShardWriter::Open(dir.Join("s.bin"), 2);
  ASSERT_TRUE(writer.ok());
  std::vector<uint32_t> piece(100000);
  for (int k = 0; k < 12; ++k) {  // 1.2M tokens in pieces: past the 1 MiB buffer several times
    for (size_t i = 0; i < piece.size(); ++i) piece[i] = uint32_t((k * piece.size() + i) % 60000);
    ASSERT_TRUE((*writer)->Append(piece.data(), piece.size()).ok());
  }
  ASSERT_TRUE((*writer)->Close().ok());
  auto corpus = TokenCorpus::Load(dir.Join("s.bin"), 60000);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  const auto& s = *(*corpus)->segments()[0];
  ASSERT_EQ(s.size(), 1200000u);
  EXPECT_EQ(s[1199999], 1199999u % 60000);
  EXPECT_EQ(s[654321], 654321u % 60000);
}

TEST(DataTest, TextBytesSumTheTokensLengths) {
  const int64_t targets[] = {1, 2, 3, 0, 1, 2, 3, 0};
  EXPECT_DOUBLE_EQ(TextBytes(targets, 8, {1, 2, 3, 4}), 20.0);  // 2 3 4 1 2 3 4 1
  EXPECT_DOUBLE_EQ(TextBytes(targets, 3, {1, 2, 3, 4}), 9.0);
  EXPECT_DOUBLE_EQ(TextBytes(targets, 8, {}), 8.0);  // bytes: one each
  EXPECT_DOUBLE_EQ(TextBytes(targets, 8, {1, 2}), 6.0);  // ids past the table stand for nothing
}

TEST(DataTest, ADirectorysManifestIsNotReadAsText) {
  TempDir dir;
  ASSERT_TRUE(WriteShard(dir.Join("shard_000000.bin"), Iota(100, 50)).ok());
  testing::WriteFile(dir.Join("manifest.json"), "{}");
  auto corpus = TokenCorpus::Load(dir.path(), 50);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_EQ((*corpus)->num_tokens(), 100u);
}

void WriteRaw(const std::string& path, const std::vector<int32_t>& header, size_t tokens) {
  std::vector<int32_t> h(256, 0);
  std::copy(header.begin(), header.end(), h.begin());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(h.data()), 1024);
  std::vector<uint16_t> t(tokens, 1);
  out.write(reinterpret_cast<const char*>(t.data()), std::streamsize(t.size() * 2));
}

TEST(DataTest, BadShardsAreRefusedWithTheFileNamed) {
  TempDir dir;
  struct Case {
    std::vector<int32_t> header;
    size_t tokens;
    const char* message;
  } cases[] = {
      {{12345, 1, 10}, 10, "bad magic 12345"},
      {{kShardMagic, 7, 10}, 10, "unsupported version 7"},
      {{kShardMagic, 1, 99}, 10, "header says 99 tokens"},
  };
  for (const auto& c : cases) {
    const std::string path = dir.Join("bad.bin");
    WriteRaw(path, c.header, c.tokens);
    auto corpus = TokenCorpus::Load(path, 256);
    ASSERT_FALSE(corpus.ok());
    EXPECT_EQ(corpus.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(corpus.status().message()), HasSubstr(c.message));
    EXPECT_THAT(std::string(corpus.status().message()), HasSubstr(path));
  }
  testing::WriteFile(dir.Join("short.bin"), "tiny");
  EXPECT_THAT(std::string(TokenCorpus::Load(dir.Join("short.bin"), 256).status().message()),
              HasSubstr("shorter than its 1024-byte header"));
  ASSERT_TRUE(WriteShard(dir.Join("big.bin"), {1, 2, 300}).ok());
  auto vocab = TokenCorpus::Load(dir.Join("big.bin"), 256);
  EXPECT_THAT(std::string(vocab.status().message()), HasSubstr("token 300 at position 2"));
}

TEST(DataTest, MissingAndMixedAndBinaryTextAreRefused) {
  TempDir dir;
  EXPECT_EQ(TokenCorpus::Load(dir.Join("nope.txt"), 256).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(TokenCorpus::Load(dir.Join("*.bin"), 256).status().code(),
            absl::StatusCode::kNotFound);
  testing::WriteFile(dir.Join("a.txt"), "text");
  ASSERT_TRUE(WriteShard(dir.Join("b.bin"), {1, 2}).ok());
  EXPECT_THAT(std::string(TokenCorpus::Load(dir.path(), 256).status().message()),
              HasSubstr("mixes .bin token shards with text"));
  testing::WriteFile(dir.Join("c.txt"), std::string("ab\0cd", 5));
  EXPECT_THAT(std::string(TokenCorpus::Load(dir.Join("c.txt"), 256).status().message()),
              HasSubstr("NUL byte at offset 2"));
  EXPECT_THAT(std::string(TokenCorpus::Load(dir.Join("a.txt"), 100).status().message()),
              HasSubstr("model.vocab >= 256"));
}

TEST(DataTest, WindowsNeverCrossSegmentsAndTargetsAreShifted) {
  TempDir dir;
  ASSERT_TRUE(WriteShard(dir.Join("s0.bin"), Iota(33, 1000)).ok());  // 4 windows of 8
  ASSERT_TRUE(WriteShard(dir.Join("s1.bin"), Iota(20, 1000)).ok());  // 2 windows of 8
  auto corpus = TokenCorpus::Load(dir.Join("*.bin"), 1000);
  ASSERT_TRUE(corpus.ok());
  WindowSet w(*corpus, 8);
  ASSERT_EQ(w.size(), 6u);
  int64_t in[8], tg[8];
  w.Fill(3, in, tg);
  EXPECT_EQ(in[0], 24);
  EXPECT_EQ(tg[7], 32);
  w.Fill(4, in, tg);
  EXPECT_EQ(in[0], 0);  // first window of the second shard
  EXPECT_EQ(tg[0], 1);
}

TEST(DataTest, ValidationSplitHoldsOutTheTail) {
  auto corpus = TokenCorpus::FromText(testing::GeneratedText(10000, 1));
  auto data = MakeDataset(corpus, nullptr, 0.1, 32, 7);
  ASSERT_TRUE(data.ok()) << data.status();
  const size_t n = WindowSet(corpus, 32).size();
  EXPECT_EQ((*data)->val.size(), size_t(std::ceil(n * 0.1)));
  EXPECT_EQ((*data)->train.size() + (*data)->val.size() + 1, n);
  EXPECT_FALSE(MakeDataset(TokenCorpus::FromText("short"), nullptr, 0.1, 32, 7).ok());
}

TEST(DataTest, PermutationIsAPermutationAndSeeded) {
  auto p = SeededPermutation(1000, 5);
  std::set<uint32_t> seen(p.begin(), p.end());
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_EQ(p, SeededPermutation(1000, 5));
  EXPECT_NE(p, SeededPermutation(1000, 6));
  // Golden order (computed by an independent Python splitmix64 + Lemire implementation): the
  // order must not change across platforms or releases.
  EXPECT_EQ(SeededPermutation(10, 42), (std::vector<uint32_t>{8, 3, 6, 5, 4, 0, 9, 2, 1, 7}));
}

TEST(DataTest, StreamsAreDisjointAndCoverTheEpoch) {
  auto corpus = TokenCorpus::FromText(testing::GeneratedText(50000, 2));
  WindowSet windows(corpus, 16);
  const int islands = 3, ranks = 2, streams = islands * ranks;
  std::set<size_t> all;
  size_t taken = 0;
  for (int island = 0; island < islands; ++island) {
    for (int rank = 0; rank < ranks; ++rank) {
      auto s = BatchSampler::Create(&windows, 9, island * ranks + rank, streams);
      ASSERT_TRUE(s.ok());
      for (size_t i = 0; i < s->windows_per_epoch(); ++i) {
        all.insert(s->PeekWindow());
        int64_t in[16], tg[16];
        s->Next(1, in, tg);
        ++taken;
      }
      EXPECT_EQ(s->cursor().epoch, 0u);
    }
  }
  EXPECT_EQ(all.size(), taken);  // no window served twice across streams
  EXPECT_EQ(taken, windows.size() / streams * streams);
}

TEST(DataTest, CursorResumesTheSameSequenceAcrossEpochs) {
  auto corpus = TokenCorpus::FromText(testing::GeneratedText(5000, 3));
  WindowSet windows(corpus, 16);
  auto a = BatchSampler::Create(&windows, 1, 0, 2);
  ASSERT_TRUE(a.ok());
  std::vector<int64_t> in(4 * 16), tg(4 * 16), in2(4 * 16), tg2(4 * 16);
  for (int i = 0; i < 60; ++i) a->Next(4, in.data(), tg.data());  // crosses epochs
  EXPECT_GT(a->cursor().epoch, 0u);
  auto b = BatchSampler::Create(&windows, 1, 0, 2);
  b->set_cursor(a->cursor());
  for (int i = 0; i < 30; ++i) {
    a->Next(4, in.data(), tg.data());
    b->Next(4, in2.data(), tg2.data());
    ASSERT_EQ(in, in2);
    ASSERT_EQ(tg, tg2);
  }
}

TEST(DataTest, TooManyStreamsIsAnError) {
  auto corpus = TokenCorpus::FromText(testing::GeneratedText(100, 3));
  WindowSet windows(corpus, 16);
  auto s = BatchSampler::Create(&windows, 1, 0, 64);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("data streams"));
}

}  // namespace
}  // namespace atl::inner
