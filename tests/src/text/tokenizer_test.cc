#include "src/text/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "inner/data.h"
#include "src/text/token_shards.h"
#include "src/text/tokenize.h"
#include "tests/test_util.h"

namespace atl::text {
namespace {

namespace fs = std::filesystem;
using ::atl::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kVocab = 400;

// One tokenizer for the suite: BPE with 400 tokens on generated text (the trainer takes ~1 s).
class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    corpus_ = new std::string(testing::GeneratedText(200000, 3) + "\nCaf\xc3\xa9 na\xc3\xafve \xe2\x82\xac 42\n");
    testing::WriteFile(dir_->Join("corpus.txt"), *corpus_);
    TrainOptions o;
    o.inputs = {dir_->Join("corpus.txt")};
    o.out = dir_->Join("tok.model");
    o.vocab_size = kVocab;
    const auto trained = TrainTokenizer(o);
    ASSERT_TRUE(trained.ok()) << trained;
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete corpus_;
  }
  static std::string Model() { return dir_->Join("tok.model"); }
  // Tokenizing the suite's corpus into `out`, silently.
  static TokenizeOptions CorpusOptions(const std::string& out) {
    TokenizeOptions o;
    o.tokenizer = Model();
    o.inputs = {dir_->Join("corpus.txt")};
    o.out = out;
    o.progress = nullptr;
    return o;
  }

  // The tokens of every shard of a directory, in order.
  static std::vector<uint32_t> ShardTokens(const std::string& dir, int vocab) {
    auto corpus = inner::TokenCorpus::Load(dir, vocab);
    EXPECT_TRUE(corpus.ok()) << corpus.status();
    std::vector<uint32_t> out;
    for (const auto& s : (*corpus)->segments()) {
      for (size_t i = 0; i < s->size(); ++i) out.push_back((*s)[i]);
    }
    return out;
  }

  static TempDir* dir_;
  static std::string* corpus_;
};
TempDir* TokenizerTest::dir_ = nullptr;
std::string* TokenizerTest::corpus_ = nullptr;

TEST_F(TokenizerTest, TrainedTokenizersDecodeBackToTheSameText) {
  auto tok = Tokenizer::Load(Model());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), kVocab);
  EXPECT_EQ((*tok)->unk_id(), 0);
  EXPECT_EQ((*tok)->bos_id(), 1);
  EXPECT_EQ((*tok)->eos_id(), 2);
  const std::string text = "The old man sees a long letter again.\n  Two  spaces, caf\xc3\xa9 \xe2\x82\xac\tand a tab.";
  auto ids = (*tok)->Encode(text);
  ASSERT_TRUE(ids.ok());
  const std::string grammar = "The old man sees a long letter again.";
  EXPECT_LT((*tok)->Encode(grammar)->size(), grammar.size() / 2) << "BPE merges the grammar's words";
  auto back = (*tok)->Decode(*ids);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, text);
  // Token by token, the texts concatenate to the same bytes; their lengths are TokenBytes.
  const auto lengths = (*tok)->TokenBytes();
  std::string joined;
  double bytes = 0;
  for (uint32_t id : *ids) {
    joined += (*tok)->TokenText(id);
    bytes += lengths[id];
  }
  EXPECT_EQ(joined, text);
  EXPECT_EQ(bytes, double(text.size()));
  EXPECT_EQ(lengths[1], 0.0f);  // <s>
  EXPECT_THAT(std::string((*tok)->Decode({5000}).status().message()), HasSubstr("token 5000 is outside"));
}

TEST_F(TokenizerTest, BadTokenizerFilesAreRefusedByName) {
  TempDir dir;
  testing::WriteFile(dir.Join("bad.model"), "not a model");
  auto bad = Tokenizer::Load(dir.Join("bad.model"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("is not a SentencePiece model"));
  EXPECT_EQ(Tokenizer::Load(dir.Join("none.model")).status().code(), absl::StatusCode::kNotFound);
  TrainOptions o;
  o.inputs = {dir.Join("missing.txt")};
  o.out = dir.Join("t.model");
  EXPECT_EQ(TrainTokenizer(o).code(), absl::StatusCode::kNotFound);
  o.inputs = {dir.Join("bad.model")};
  o.vocab_size = 100;
  EXPECT_THAT(std::string(TrainTokenizer(o).message()), HasSubstr("--vocab-size must be in [260"));
}

TEST_F(TokenizerTest, ShardsDoNotDependOnThreadsOrChunksAndDecodeToTheCorpus) {
  TempDir out;
  TokenizeOptions o = CorpusOptions(out.Join("one"));
  o.threads = 1;
  o.chunk_bytes = 1 << 16;
  auto one = Tokenize(o);
  ASSERT_TRUE(one.ok()) << one.status();
  o.out = out.Join("many");
  o.threads = 3;
  o.chunk_bytes = 997;  // many chunks, cut at line ends
  o.shard_tokens = 9000;
  auto many = Tokenize(o);
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_GT(many->manifest.shards.size(), 3u);
  const auto a = ShardTokens(out.Join("one"), kVocab), b = ShardTokens(out.Join("many"), kVocab);
  EXPECT_EQ(a, b);
  // bos, the corpus, eos; what is between them decodes to the corpus.
  ASSERT_GE(a.size(), 3u);
  EXPECT_EQ(a.front(), 1u);
  EXPECT_EQ(a.back(), 2u);
  auto tok = Tokenizer::Load(Model());
  auto text = (*tok)->Decode(std::vector<uint32_t>(a.begin() + 1, a.end() - 1));
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, *corpus_);
  // The manifest: the tokenizer's hash, the counts, the bytes the tokens stand for.
  auto m = ReadManifest(out.Join("many"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->tokenizer_hash, (*tok)->hash());
  EXPECT_EQ(m->vocab_size, kVocab);
  EXPECT_EQ(m->token_width, 2);
  EXPECT_EQ(m->tokens(), int64_t(b.size()));
  int64_t text_bytes = 0;
  for (const auto& s : m->shards) {
    EXPECT_LE(s.tokens, 9000);
    text_bytes += s.text_bytes;
  }
  EXPECT_EQ(text_bytes, int64_t(corpus_->size()));
  EXPECT_EQ(m->input_bytes, int64_t(corpus_->size()));
  // A directory that already holds shards is not written over.
  EXPECT_EQ(Tokenize(o).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(TokenizerTest, TheTokensAreSentencePiecesOwnAsPythonsBindingEncodesThem) {
  // Debian's python3-sentencepiece (deploy/test.sh installs it), whatever else is first on PATH.
  if (testing::RunCommand("/usr/bin/python3 -c 'import sentencepiece'").exit_code != 0) {
    GTEST_SKIP() << "python3-sentencepiece is not installed (deploy/test.sh installs it)";
  }
  TempDir out;
  TokenizeOptions o = CorpusOptions(out.Join("s"));
  o.chunk_bytes = 1 << 20;  // one chunk: the whole file, as the binding gets it
  o.document_marks = false;
  ASSERT_TRUE(Tokenize(o).ok());
  const auto mine = ShardTokens(out.Join("s"), kVocab);
  const auto r = testing::RunCommand(
      "/usr/bin/python3 -c \"import sentencepiece as s; p = s.SentencePieceProcessor(model_file='" +
      Model() + "'); print(' '.join(map(str, p.encode(open('" + dir_->Join("corpus.txt") +
      "', encoding='utf-8').read()))))\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<uint32_t> theirs;
  std::istringstream in(r.output);
  for (uint32_t id; in >> id;) theirs.push_back(id);
  EXPECT_EQ(mine, theirs);
}

TEST_F(TokenizerTest, Uint32ShardsHoldTheSameTokens) {
  TempDir out;
  TokenizeOptions o = CorpusOptions(out.Join("narrow"));
  ASSERT_TRUE(Tokenize(o).ok());
  o.out = out.Join("wide");
  o.token_width = 4;
  auto wide = Tokenize(o);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->manifest.token_width, 4);
  std::ifstream shard(out.Join("wide") + "/shard_000000.bin", std::ios::binary);
  int32_t magic = 0;
  shard.read(reinterpret_cast<char*>(&magic), 4);
  EXPECT_EQ(magic, inner::kShardMagic32);
  EXPECT_EQ(ShardTokens(out.Join("wide"), kVocab), ShardTokens(out.Join("narrow"), kVocab));
  o.out = out.Join("bad");
  o.token_width = 3;
  EXPECT_THAT(std::string(Tokenize(o).status().message()), HasSubstr("--token-bytes 3 cannot hold"));
}

TEST_F(TokenizerTest, RunsRefuseShardsOfAnotherTokenizerOrVocabulary) {
  TempDir dir;
  TokenizeOptions o = CorpusOptions(dir.Join("shards"));
  ASSERT_TRUE(Tokenize(o).ok());
  // Another tokenizer: the same corpus, another vocabulary size.
  TrainOptions t;
  t.inputs = {dir_->Join("corpus.txt")};
  t.out = dir.Join("other.model");
  t.vocab_size = 300;
  ASSERT_TRUE(TrainTokenizer(t).ok());

  inner::ModelConfig model;
  model.vocab = kVocab;
  inner::DataConfig data;
  data.path = dir.Join("shards");
  data.tokenizer = Model();
  EXPECT_TRUE(CheckData(data, model).ok()) << CheckData(data, model);
  auto loaded = LoadDataset(data, model);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->token_bytes.size(), size_t(kVocab));
  EXPECT_FALSE((*loaded)->per_byte);

  auto refusal = [&](const inner::DataConfig& d, const inner::ModelConfig& m) {
    const auto s = CheckData(d, m);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_EQ(LoadDataset(d, m).status(), s);  // the run refuses the same way
    return std::string(s.message());
  };
  auto other = data;
  other.tokenizer = dir.Join("other.model");
  auto m300 = model;
  m300.vocab = 300;
  EXPECT_THAT(refusal(other, m300), HasSubstr("holds shards made with another tokenizer"));
  EXPECT_THAT(refusal(data, m300), HasSubstr("model.vocab = 300 but data.tokenizer"));
  auto none = data;
  none.tokenizer.clear();
  EXPECT_THAT(refusal(none, model), HasSubstr("set data.tokenizer to it"));
  auto text = data;
  text.path = dir_->Join("corpus.txt");
  EXPECT_THAT(refusal(text, model), HasSubstr("is text, read byte by byte"));
  // The validation data is checked too.
  auto val = data;
  val.val_path = dir.Join("shards");
  EXPECT_TRUE(CheckData(val, model).ok());
  val.val_path = dir_->Join("corpus.txt");
  EXPECT_THAT(refusal(val, model), HasSubstr("data.val_path"));
  // A manifest that is not one is refused by field.
  testing::WriteFile(dir.Join("shards/manifest.json"), R"({"format": "atoll token shards", "version": 1,
      "tokenizer": {"xxh64": "00", "vocab_size": 400}, "token_bytes": 3, "shards": []})");
  const auto bad = CheckData(data, model);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("token_bytes must be 2 or 4"));
}

TEST_F(TokenizerTest, ACorpusLargerThanTheMemoryBoundStreamsThrough) {
  // `atoll tokenize` holds at most 2 x threads chunks of text at once: its peak memory on a corpus
  // 24 MB larger is within 12 MiB of its peak on a small one.
  TempDir dir;
  const std::string small = dir.Join("small.txt"), large = dir.Join("large.txt");
  testing::WriteFile(small, testing::GeneratedText(200000, 5));
  {
    std::ofstream out(large, std::ios::binary);
    for (int i = 0; i < 24; ++i) out << testing::GeneratedText(1000000, 10 + i) << "\n";
  }
  auto peak = [&](const std::string& input, const std::string& out) {
    const auto r = testing::RunCommand(std::string(ATOLL_BIN) + " tokenize --tokenizer " + Model() +
                                       " --input " + input + " --out " + out + " --threads 2");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(r.output, m, std::regex("peak RSS ([0-9.]+) MiB"))) << r.output;
    EXPECT_THAT(r.output, HasSubstr("MB/s"));  // the progress and summary lines
    return m.size() > 1 ? std::stod(m[1]) : 0.0;
  };
  const double a = peak(small, dir.Join("s")), b = peak(large, dir.Join("l"));
  EXPECT_GT(fs::file_size(large), 24'000'000u);
  EXPECT_LT(b - a, 12.0) << "peak RSS " << a << " MiB on 0.2 MB, " << b << " MiB on 24 MB";
  auto m = ReadManifest(dir.Join("l"));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->input_bytes, int64_t(fs::file_size(large)));
}

TEST_F(TokenizerTest, ALlamaTrainsOnTokenShardsExportsWithItsTokenizerAndGenerates) {
  // The README's path, small: tokenize, train a Llama on the shards, export, generate.
  TempDir dir;
  testing::WriteFile(dir.Join("val.txt"), testing::GeneratedText(20000, 9));
  auto atoll = [](const std::string& args) { return testing::RunCommand(std::string(ATOLL_BIN) + " " + args); };
  for (const char* split : {"train", "val"}) {
    const std::string input = std::string(split) == "train" ? dir_->Join("corpus.txt") : dir.Join("val.txt");
    const auto r = atoll("tokenize --tokenizer " + Model() + " --input " + input + " --out " + dir.Join(split));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const std::string config = "--config " ATOLL_SOURCE_DIR "/deploy/configs/llama-tiny.toml --data.path=" +
                             dir.Join("train") + " --data.val_path=" + dir.Join("val") +
                             " --data.tokenizer=" + Model() +
                             " --model.n_layer=1 --model.d_model=32 --model.n_head=2 --model.n_kv_head=1"
                             " --model.ffn_hidden=64 --model.context=32 --train.batch_size=4"
                             " --train.eval_batches=2 --train.eval_every=10 --train.steps=20 --optim.warmup_steps=2";
  // The vocabulary must be the tokenizer's; the error says which to set.
  auto r = atoll("train " + config + " --model.vocab=512 --run-dir " + dir.Join("bad"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("model.vocab = 512 but data.tokenizer"));
  r = atoll("train " + config + " --model.vocab=400 --run-dir " + dir.Join("run"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("bpb "));
  std::ifstream metrics(dir.Join("run/metrics.jsonl"));
  nlohmann::json last;
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) last = j;
  }
  ASSERT_TRUE(last.contains("val_bpb")) << last.dump();
  // Each token stands for several bytes: fewer bits per byte than per token.
  EXPECT_LT(last["val_bpb"].get<double>(), last["val_bits_per_token"].get<double>() / 2);

  // Export: the tokenizer files beside the model, the special ids in the configs.
  r = atoll("export " + dir.Join("run") + " --format hf --out " + dir.Join("hf"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* f : {"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"}) {
    EXPECT_TRUE(fs::exists(dir.Join("hf") + "/" + f)) << f;
  }
  EXPECT_EQ(testing::ReadFile(dir.Join("hf/tokenizer.model")), testing::ReadFile(Model()));
  const auto hf_config = nlohmann::json::parse(testing::ReadFile(dir.Join("hf/config.json")));
  EXPECT_EQ(hf_config["bos_token_id"], 1);
  EXPECT_EQ(hf_config["eos_token_id"], 2);
  EXPECT_EQ(nlohmann::json::parse(testing::ReadFile(dir.Join("hf/tokenizer_config.json")))["tokenizer_class"],
            "LlamaTokenizer");

  // Generate with the run's tokenizer: from the run and from the exported directory, the same
  // text (greedy); the continuation is the grammar's words, not bytes.
  auto generate = [&](const std::string& source) {
    return testing::RunCommand("{ " + std::string(ATOLL_BIN) + " generate --checkpoint " + source +
                               " --prompt 'The cat' --tokens 12 --temperature 0 2>/dev/null; }");
  };
  const auto from_run = generate(dir.Join("run"));
  ASSERT_EQ(from_run.exit_code, 0) << from_run.output;
  EXPECT_EQ(from_run.output.substr(0, 7), "The cat");
  EXPECT_GT(from_run.output.size(), 7u + 12u) << "12 tokens of several bytes: " << from_run.output;
  EXPECT_EQ(generate(dir.Join("hf")).output, from_run.output);
  // A model with a vocabulary but no tokenizer it knows of is refused with what to give.
  fs::remove(dir.Join("hf/tokenizer.model"));
  const auto none = generate(dir.Join("hf"));
  EXPECT_NE(none.exit_code, 0);
  r = testing::RunCommand(std::string(ATOLL_BIN) + " generate --checkpoint " + dir.Join("hf") + " --prompt x");
  EXPECT_THAT(r.output, HasSubstr("give --tokenizer FILE"));
}

}  // namespace
}  // namespace atl::text
