// Models in and out of atoll: the safetensors format and its rules, the GPT-2 name mapping, the
// sources a model is read from, and end to end through the binary: export -> import -> one more
// round equals one more round from the run's own state, bit for bit; `atoll generate`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include "inner/model.h"
#include "src/store/hf_format.h"
#include "src/store/model_io.h"
#include "src/store/safetensors.h"
#include "src/text/tokenizer.h"
#include "tests/test_util.h"

namespace atl {
namespace {

using ::atl::testing::TempDir;
using ::testing::HasSubstr;

// GPT-2's Hugging Face name of an atoll parameter (its family's mapping).
std::string Gpt2Name(const std::string& atoll_name, bool* transposed) {
  return hf::Name(inner::ModelConfig{}, atoll_name, transposed);
}

// A safetensors file from a header given as text and `data_bytes` bytes of data.
std::string RawFile(const std::string& header, size_t data_bytes, uint8_t fill = 0) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char(uint64_t(header.size()) >> (8 * i));
  return out + header + std::string(data_bytes, char(fill));
}

absl::Status OpenError(const TempDir& dir, const std::string& contents) {
  testing::WriteFile(dir.Join("f.safetensors"), contents);
  return safetensors::File::Open(dir.Join("f.safetensors")).status();
}

TEST(SafetensorsTest, WritesTheFormatAndReadsItBackBitExact) {
  TempDir dir;
  const std::vector<float> a = {1.5f, -0.0f, 3.4028235e38f, 1e-45f, 0.1f, -7.25f};
  const std::vector<float> b = {42.0f};
  ASSERT_TRUE(safetensors::Write(dir.Join("x.safetensors"),
                                    {{"a", {2, 3}, a.data()}, {"b.c", {1}, b.data()}},
                                    {{"k", "v"}})
                  .ok());
  // The layout by the format's rules: LE header length, JSON, data 8-byte aligned after it.
  const std::string bytes = testing::ReadFile(dir.Join("x.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["k"], "v");
  EXPECT_EQ(header["a"]["dtype"], "F32");
  EXPECT_EQ(header["a"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(header["b.c"]["data_offsets"], nlohmann::json({24, 28}));
  EXPECT_EQ(bytes.size(), 8 + n + 28);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, a.data(), 24), 0);

  auto file = safetensors::File::Open(dir.Join("x.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("k"), "v");
  ASSERT_EQ(file->tensors().size(), 2u);
  auto read = file->ReadFloats(*file->Find("a"));
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(std::memcmp(read->data(), a.data(), 24), 0);  // -0.0 and the subnormal too
}

TEST(SafetensorsTest, WidensF16AndBf16Exactly) {
  TempDir dir;
  // F16: 1.0, -2.0, 65504 (max), 2^-24 (smallest subnormal); BF16: 1.0, -0.5.
  const uint16_t f16[] = {0x3C00, 0xC000, 0x7BFF, 0x0001};
  const uint16_t bf16[] = {0x3F80, 0xBF00};
  std::string data(reinterpret_cast<const char*>(f16), 8);
  data += std::string(reinterpret_cast<const char*>(bf16), 4);
  const std::string header =
      R"({"h":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]}})";
  testing::WriteFile(dir.Join("h.safetensors"), RawFile(header, 0) + data);
  auto file = safetensors::File::Open(dir.Join("h.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*file->ReadFloats(*file->Find("h")),
            (std::vector<float>{1.0f, -2.0f, 65504.0f, 5.9604644775390625e-8f}));
  EXPECT_EQ(*file->ReadFloats(*file->Find("b")), (std::vector<float>{1.0f, -0.5f}));
}

TEST(SafetensorsTest, RefusesFilesThatBreakTheRulesByName) {
  TempDir dir;
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"abc", "shorter than its 8-byte header length"},
      {std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8), "exceeds the format's limit"},
      {RawFile("{}", 0).substr(0, 9), "exceeds the file"},
      {RawFile("[1,2]", 0), "does not start with '{'"},
      {RawFile("{\"t\":", 0), "not a JSON object"},
      {RawFile("{" + ok_entry + "," + ok_entry + "}", 8), "tensor 't' appears twice"},
      {RawFile(R"({"t":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8), "unknown dtype 'F33'"},
      {RawFile(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "not a non-negative"},
      {RawFile(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,80]}})", 8), "outside the 8 data bytes"},
      {RawFile(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "shape needs 12"},
      {RawFile(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "leaving a hole"},
      {RawFile("{" + ok_entry + R"(,"u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       "overlapping"},
      {RawFile("{" + ok_entry + "}", 12), "cover 8 of the 12 data bytes"},
      {RawFile(R"({"__metadata__":{"k":1}})", 0), "metadata 'k' is not a string"},
      {RawFile(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8),
       "unknown field 'x'"},
      {RawFile(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
       "more elements than the file"},
  };
  for (const auto& [contents, message] : cases) {
    const auto s = OpenError(dir, contents);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << message << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(message));
  }
  // Other dtypes are indexed (the file is valid) but not read as floats.
  testing::WriteFile(dir.Join("i.safetensors"),
                     RawFile(R"({"t":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8));
  auto file = safetensors::File::Open(dir.Join("i.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT(std::string(file->ReadFloats(file->tensors()[0]).status().message()),
              HasSubstr("'t' is I64; atoll reads F32, F16 and BF16"));
}

inner::ModelConfig SmallModel() {
  inner::ModelConfig m;
  m.n_layer = 2;
  m.d_model = 16;
  m.n_head = 2;
  m.context = 8;
  m.vocab = 256;
  return m;
}

ModelWeights WeightsOf(const inner::ModelConfig& m) {
  const inner::CausalLm model = inner::BuildModel(m);
  ModelWeights w;
  w.model = m;
  for (auto& [name, p] : inner::NamedParameters(*model)) w.params.emplace_back(name, p.detach().clone());
  return w;
}

void ExpectBitIdentical(const ModelWeights& a, const ModelWeights& b) {
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_EQ(a.params[i].first, b.params[i].first);
    ASSERT_TRUE(a.params[i].second.sizes().equals(b.params[i].second.sizes())) << a.params[i].first;
    EXPECT_EQ(std::memcmp(a.params[i].second.data_ptr(), b.params[i].second.data_ptr(),
                          size_t(a.params[i].second.numel()) * 4),
              0)
        << a.params[i].first;
  }
}

TEST(ModelIoTest, Gpt2NamesFollowHuggingFace) {
  bool t = false;
  EXPECT_EQ(Gpt2Name("tok_emb.weight", &t), "transformer.wte.weight");
  EXPECT_FALSE(t);
  EXPECT_EQ(Gpt2Name("pos_emb.weight", &t), "transformer.wpe.weight");
  EXPECT_EQ(Gpt2Name("blocks.11.ln1.bias", &t), "transformer.h.11.ln_1.bias");
  EXPECT_EQ(Gpt2Name("blocks.0.attn.qkv.weight", &t), "transformer.h.0.attn.c_attn.weight");
  EXPECT_TRUE(t);
  EXPECT_EQ(Gpt2Name("blocks.0.attn.qkv.bias", &t), "transformer.h.0.attn.c_attn.bias");
  EXPECT_FALSE(t);
  EXPECT_EQ(Gpt2Name("blocks.3.mlp.proj.weight", &t), "transformer.h.3.mlp.c_proj.weight");
  EXPECT_TRUE(t);
  EXPECT_EQ(Gpt2Name("blocks.3.mlp.fc.bias", &t), "transformer.h.3.mlp.c_fc.bias");
  EXPECT_EQ(Gpt2Name("ln_f.weight", &t), "transformer.ln_f.weight");
  EXPECT_EQ(Gpt2Name("head.weight", &t), "lm_head.weight");
}

TEST(ModelIoTest, SafetensorsRoundTripIsBitExactInBothNameStyles) {
  TempDir dir;
  const auto m = SmallModel();
  const ModelWeights w = WeightsOf(m);
  for (auto style : {NameStyle::kHf, NameStyle::kAtoll}) {
    ASSERT_TRUE(WriteSafetensors(w, dir.Join("m.safetensors"), style).ok());
    auto back = LoadWeights(dir.Join("m.safetensors"), nullptr);  // the metadata says the model
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(CheckSameArchitecture(m, back->model, "file").ok());
    ExpectBitIdentical(w, *back);
  }
  // GPT-2 layout: Conv1D weights [in, out].
  ASSERT_TRUE(WriteSafetensors(w, dir.Join("g.safetensors"), NameStyle::kHf).ok());
  auto file = safetensors::File::Open(dir.Join("g.safetensors"));
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->Find("transformer.h.1.attn.c_attn.weight")->shape, (std::vector<int64_t>{16, 48}));
  EXPECT_EQ(file->Find("transformer.h.1.mlp.c_proj.weight")->shape, (std::vector<int64_t>{64, 16}));
  const auto qkv = *file->ReadFloats(*file->Find("transformer.h.1.attn.c_attn.weight"));
  const auto& atoll_qkv = w.params[2 + 12 + 2].second;  // blocks.1.attn.qkv.weight [48, 16]
  EXPECT_EQ(qkv[size_t(5 * 48 + 7)], atoll_qkv[7][5].item<float>());
}

// A GPT-2 file as other tools write it: no atoll metadata, head tied to wte (absent), attention
// mask buffers present.
TEST(ModelIoTest, ReadsForeignGpt2FilesAndRefusesOtherModelsByName) {
  TempDir dir;
  const auto m = SmallModel();
  const ModelWeights w = WeightsOf(m);
  std::vector<at::Tensor> keep;
  std::vector<safetensors::TensorView> views;
  auto add = [&](const std::string& name, at::Tensor t) {
    keep.push_back(t.contiguous());
    views.push_back({name, keep.back().sizes().vec(), keep.back().data_ptr<float>()});
  };
  for (const auto& [name, tensor] : w.params) {
    if (name == "head.weight") continue;
    bool transposed = false;
    const std::string stored = Gpt2Name(name, &transposed);
    add(stored, transposed ? tensor.t() : tensor);
  }
  add("transformer.h.0.attn.bias", torch::ones({1, 1, 8, 8}));
  ASSERT_TRUE(safetensors::Write(dir.Join("hf.safetensors"), views, {{"format", "pt"}}).ok());

  auto no_heads = LoadWeights(dir.Join("hf.safetensors"), nullptr);
  EXPECT_THAT(std::string(no_heads.status().message()), HasSubstr("give --config with model.n_head"));
  Config config;
  config.model.n_head = 2;
  auto read = LoadWeights(dir.Join("hf.safetensors"), &config);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(CheckSameArchitecture(m, read->model, "file").ok());
  EXPECT_TRUE(torch::equal(read->params.back().second, w.params[0].second));  // tied head

  // A tensor of no parameter, a wrong shape, a NaN: each refused by name.
  add("transformer.h.9.mlp.c_fc.weight", torch::zeros({2}));
  ASSERT_TRUE(safetensors::Write(dir.Join("extra.safetensors"), views, {}).ok());
  EXPECT_THAT(std::string(LoadWeights(dir.Join("extra.safetensors"), &config).status().message()),
              HasSubstr("tensor transformer.h.9.mlp.c_fc.weight is not a parameter of this model"));
  views.pop_back();
  views[4].shape = {16, 24, 2};  // transformer.h.0.attn.c_attn.weight
  ASSERT_TRUE(safetensors::Write(dir.Join("shape.safetensors"), views, {}).ok());
  EXPECT_THAT(std::string(LoadWeights(dir.Join("shape.safetensors"), &config).status().message()),
              HasSubstr("has shape [16, 24, 2], the model needs [16, 48]"));
  ModelWeights nan = w;
  nan.params[5].second = nan.params[5].second.clone();  // blocks.0.attn.qkv.bias
  nan.params[5].second[0] = std::nanf("");
  ASSERT_TRUE(WriteSafetensors(nan, dir.Join("nan.safetensors"), NameStyle::kHf).ok());
  EXPECT_THAT(std::string(LoadWeights(dir.Join("nan.safetensors"), nullptr).status().message()),
              HasSubstr("transformer.h.0.attn.c_attn.bias holds a non-finite value"));
  // Metadata that claims more than the file holds is refused before anything is listed.
  ASSERT_TRUE(safetensors::Write(dir.Join("claim.safetensors"), views,
                                    {{"atoll.model", R"({"n_layer":1000000000,"d_model":16,)"
                                                     R"("n_head":2,"context":8,"vocab":256})"}})
                  .ok());
  EXPECT_THAT(std::string(LoadWeights(dir.Join("claim.safetensors"), nullptr).status().message()),
              HasSubstr("metadata says 1000000000 blocks"));
  // A run config of another model refuses the file.
  config.model = m;
  config.model.d_model = 32;
  config.train.init_from = dir.Join("hf.safetensors");
  EXPECT_THAT(std::string(InitialWeights(config).status().message()), HasSubstr("model.d_model = 16"));
}

// ---- end to end through the binary

testing::CommandResult Atoll(const std::string& args) {
  return testing::RunCommand(std::string(ATOLL_BIN) + " " + args);
}

// Its standard output alone (generate's tokens per second go to stderr).
testing::CommandResult AtollStdout(const std::string& args) {
  return testing::RunCommand("{ " + std::string(ATOLL_BIN) + " " + args + " 2>/dev/null; }");
}

std::vector<std::string> RoundHashes(const std::string& run) {
  std::vector<std::string> out;
  std::ifstream in(run + "/coordinator/rounds.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line)["params_hash"]);
  return out;
}

// The baseline (`atoll train`) starts from an exported file or from a run's state alike: the same
// losses.
void ExpectTheBaselineStartsFromTheExportOrTheState(const TempDir& dir, const std::string& file,
                                                    const std::string& state) {
  for (const char* name : {"tb", "tc"}) {
    const std::string from = std::string(name) == "tb" ? file : state;
    auto r = Atoll("train --config " + dir.Join("run.toml") + " --run-dir " + dir.Join(name) +
                   " --train.steps=2 --train.init_from=" + from);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  auto losses = [&](const char* name) {
    std::vector<double> out;
    std::ifstream in(dir.Join(name) + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line)["loss"]);
    return out;
  };
  EXPECT_EQ(losses("tb").size(), 2u);
  EXPECT_EQ(losses("tb"), losses("tc"));
}

// Generation from a run: the prompt and 24 sampled bytes; the same seed, the same text, with or
// without the key/value cache; bad sampling flags refused.
void ExpectGenerateSamplesTheSameTextForTheSameSeed(const std::string& run) {
  // (stdout only: the tokens per second go to stderr.)
  const std::string generate = "generate --checkpoint " + run + " --prompt 'The ' --tokens 24 ";
  auto r = AtollStdout(generate + "--seed 5 --temperature 0.9 --top-k 20 --top-p 0.9");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.size(), 4u + 24u + 1u);
  EXPECT_EQ(r.output.substr(0, 4), "The ");
  EXPECT_EQ(AtollStdout(generate + "--seed 5 --temperature 0.9 --top-k 20 --top-p 0.9").output,
            r.output);
  // The key/value cache samples what the whole window's forward samples (28 bytes fit the
  // context): the same seed, the same text.
  EXPECT_EQ(AtollStdout(generate + "--seed 5 --temperature 0.9 --top-k 20 --top-p 0.9 --no-cache").output,
            r.output);
  EXPECT_THAT(Atoll(generate + "--seed 5").output, ::testing::ContainsRegex(
                                                       "atoll generate: 24 tokens in [0-9.]+ s \\([0-9.]+ "
                                                       "tokens/s, key/value cache\\)"));
  r = Atoll(generate + "--temperature -1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--temperature must be in [0, 100]"));
  r = Atoll(generate + "--top-p 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--top-p must be in (0, 1]"));
}

TEST(ModelCommandsTest, ExportImportThenOneMoreRoundIsBitExact) {
  TempDir dir;
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(60000, 9));
  testing::WriteFile(dir.Join("run.toml"),
                     "[model]\nn_layer = 2\nd_model = 32\nn_head = 2\ncontext = 32\n"
                     "[data]\npath = \"" + dir.Join("text.txt") + "\"\nval_fraction = 0.1\n"
                     "[train]\nsteps = 8\nbatch_size = 2\neval_every = 4\neval_batches = 2\n"
                     "threads = 1\ncheckpoint_every = 4\n[optim]\nwarmup_steps = 2\n"
                     "[outer]\nsync_every = 4\n");
  const std::string local = "local --islands 2 --config ";
  auto r = Atoll(local + dir.Join("run.toml") + " --run-dir " + dir.Join("a"));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // The global model of run a, out and back in.
  r = Atoll("export " + dir.Join("a") + " --out " + dir.Join("a.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the global model of run 'atoll' after 2 rounds"));
  r = Atoll("import " + dir.Join("a.safetensors") + " --config " + dir.Join("run.toml") +
            " --out " + dir.Join("b.toml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(testing::ReadFile(dir.Join("b.toml")), HasSubstr("init_from = '" + dir.Join("a.safetensors")));
  r = Atoll("import " + dir.Join("a.safetensors") + " --out " + dir.Join("b.toml"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("exists"));

  // One more round from the imported file, and from run a's own state: the same bits.
  r = Atoll(local + dir.Join("b.toml") + " --run-dir " + dir.Join("b") + " --train.steps=4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Atoll(local + dir.Join("run.toml") + " --run-dir " + dir.Join("c") + " --train.steps=4 " +
            "--train.init_from=" + dir.Join("a/coordinator"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Atoll(local + dir.Join("run.toml") + " --run-dir " + dir.Join("fresh") + " --train.steps=4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto b = RoundHashes(dir.Join("b")), c = RoundHashes(dir.Join("c"));
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b, c);
  EXPECT_NE(b, RoundHashes(dir.Join("fresh")));
  // And out again: the same file, byte for byte.
  r = Atoll("export " + dir.Join("a.safetensors") + " --out " + dir.Join("again.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(testing::ReadFile(dir.Join("a.safetensors")), testing::ReadFile(dir.Join("again.safetensors")));

  ASSERT_NO_FATAL_FAILURE(
      ExpectTheBaselineStartsFromTheExportOrTheState(dir, dir.Join("a.safetensors"), dir.Join("a")));

  // An island's checkpoint exports too; a model that does not fit the run is refused by field.
  r = Atoll("export " + dir.Join("a/island0") + " --names atoll --out " + dir.Join("i.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("at step 8"));
  r = Atoll("train --config " + dir.Join("run.toml") + " --run-dir " + dir.Join("bad") +
            " --model.d_model=64 --train.init_from=" + dir.Join("a.safetensors"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("has model.d_model = 32, the config 64"));

  ASSERT_NO_FATAL_FAILURE(ExpectGenerateSamplesTheSameTextForTheSameSeed(dir.Join("a")));
}

inner::ModelConfig SmallLlama(bool tied = false) {
  inner::ModelConfig m = SmallModel();
  m.arch = "llama";
  m.n_head = 4;
  m.n_kv_head = 2;
  m.ffn_hidden = 24;
  m.rope_theta = 500000;
  m.tie_embeddings = tied;
  return m;
}

// A Hugging Face directory of each family (Llama tied and untied, GPT-2) reads back bit for bit
// in f32, with config.json's keys; Llama's names are Hugging Face's, its tensors in their layout.
// A GPT whose final LayerNorm outputs e0 at every position (weight 0, bias e0) and whose head
// scores only token `favourite`: greedy decoding emits that token, always.
ModelWeights Always(const inner::ModelConfig& m, int64_t favourite) {
  ModelWeights w = WeightsOf(m);
  for (auto& [name, t] : w.params) {
    if (name == "ln_f.weight") t.zero_();
    if (name == "ln_f.bias") t.zero_()[0] = 1;
    if (name == "head.weight") t.zero_()[favourite][0] = 10;
  }
  return w;
}

TEST(ModelCommandsTest, GenerateWritesTheTokenizersTextAndStopsAtItsEndOfText) {
  TempDir dir;
  testing::WriteFile(dir.Join("corpus.txt"), testing::GeneratedText(50000, 2));
  text::TrainOptions t;
  t.inputs = {dir.Join("corpus.txt")};
  t.out = dir.Join("tok.model");
  t.vocab_size = 300;
  ASSERT_TRUE(text::TrainTokenizer(t).ok());
  auto tok = text::Tokenizer::Load(t.out);
  ASSERT_TRUE(tok.ok());
  inner::ModelConfig m = SmallModel();
  m.vocab = 300;
  const auto lengths = (*tok)->TokenBytes();  // the longest piece: several bytes
  const int64_t word = std::max_element(lengths.begin(), lengths.end()) - lengths.begin();
  ASSERT_GE((*tok)->TokenText(uint32_t(word)).size(), 3u);
  ASSERT_TRUE(WriteSafetensors(Always(m, word), dir.Join("word.safetensors"), NameStyle::kAtoll).ok());
  ASSERT_TRUE(WriteSafetensors(Always(m, (*tok)->eos_id()), dir.Join("eos.safetensors"), NameStyle::kAtoll).ok());
  // stdout (the text) or stderr (the tokens' count), one at a time.
  auto generate = [&](const std::string& file, const char* drop = "2>/dev/null") {
    return testing::RunCommand("{ " + std::string(ATOLL_BIN) + " generate --checkpoint " + dir.Join(file) +
                               " --tokenizer " + t.out + " --prompt 'A dog' --tokens 3 --temperature 0 " +
                               drop + "; }");
  };
  const std::string piece = (*tok)->TokenText(uint32_t(word));
  auto r = generate("word.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "A dog" + piece + piece + piece + "\n");
  EXPECT_THAT(generate("word.safetensors", ">/dev/null").output, HasSubstr("3 tokens in"));
  // Both into one pipe: the text ends its line before the stats line starts.
  EXPECT_THAT(generate("word.safetensors", "2>&1").output,
              ::testing::StartsWith("A dog" + piece + piece + piece + "\natoll generate: 3 tokens in"));
  r = generate("eos.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "A dog\n");
  r = generate("eos.safetensors", ">/dev/null");
  EXPECT_THAT(r.output, HasSubstr("0 tokens in"));
  EXPECT_THAT(r.output, HasSubstr("stopped at the end-of-text token"));
  // A tokenizer of another vocabulary is refused.
  m.vocab = 301;
  ASSERT_TRUE(WriteSafetensors(WeightsOf(m), dir.Join("other.safetensors"), NameStyle::kAtoll).ok());
  r = generate("other.safetensors", "");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("has 300 tokens but the model's vocab is 301"));
}

TEST(HfFormatTest, DirectoriesRoundTripBitExactInF32) {
  TempDir dir;
  for (const auto& m : {SmallLlama(), SmallLlama(/*tied=*/true), SmallModel()}) {
    const ModelWeights w = WeightsOf(m);
    const std::string out = dir.Join(absl::StrCat("hf-", m.arch, m.tie_embeddings));
    auto files = hf::Write(w, out, {});
    ASSERT_TRUE(files.ok()) << files.status();
    EXPECT_EQ(*files, (std::vector<std::string>{"model.safetensors", "config.json",
                                                "generation_config.json"}));
    auto back = LoadWeights(out, nullptr);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(CheckSameArchitecture(m, back->model, "directory").ok());
    ExpectBitIdentical(w, *back);
    // Writing over an export is refused.
    EXPECT_EQ(hf::Write(w, out, {}).status().code(), absl::StatusCode::kAlreadyExists);
  }
  const auto config = nlohmann::json::parse(testing::ReadFile(dir.Join("hf-llama0/config.json")));
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["hidden_size"], 16);
  EXPECT_EQ(config["intermediate_size"], 24);
  EXPECT_EQ(config["num_attention_heads"], 4);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["rope_theta"], 500000.0);
  EXPECT_EQ(config["max_position_embeddings"], 8);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  auto file = safetensors::File::Open(dir.Join("hf-llama0/model.safetensors"));
  ASSERT_TRUE(file.ok());
  for (const char* name : {"model.embed_tokens.weight", "model.layers.1.self_attn.k_proj.weight",
                           "model.layers.0.mlp.gate_proj.weight", "model.layers.0.input_layernorm.weight",
                           "model.layers.0.post_attention_layernorm.weight", "model.norm.weight",
                           "lm_head.weight"}) {
    EXPECT_NE(file->Find(name), nullptr) << name;
  }
  EXPECT_EQ(file->Find("model.layers.1.self_attn.k_proj.weight")->shape, (std::vector<int64_t>{8, 16}));
  auto tied = safetensors::File::Open(dir.Join("hf-llama1/model.safetensors"));
  ASSERT_TRUE(tied.ok());
  EXPECT_EQ(tied->Find("lm_head.weight"), nullptr);
  EXPECT_EQ(nlohmann::json::parse(testing::ReadFile(dir.Join("hf-gpt20/config.json")))["n_embd"], 16);
}

// bf16: every value rounded to nearest even (the same words torch's conversion gives), read back
// widened exactly; past the shard bound, shards and an index that maps every tensor.
TEST(HfFormatTest, Bf16RoundsToNearestEvenAndShardsCarryAnIndex) {
  TempDir dir;
  const auto m = SmallLlama();
  ModelWeights w = WeightsOf(m);
  // Values that sit exactly between two bf16 neighbours round to the even one.
  w.params[0].second.view({-1})[0] = 1.0f + 1.0f / 256;        // halfway: down to 1.0
  w.params[0].second.view({-1})[1] = 1.0f + 3.0f / 256;        // halfway: up to 1 + 4/256
  hf::ExportOptions o;
  o.bf16 = true;
  o.max_shard_bytes = 4096;
  auto files = hf::Write(w, dir.Join("bf16"), o);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_GT(files->size(), 4u);  // several shards, the index, the two configs
  EXPECT_EQ((*files)[0], absl::StrFormat("model-00001-of-%05d.safetensors", files->size() - 3));
  const auto index = nlohmann::json::parse(testing::ReadFile(dir.Join("bf16/model.safetensors.index.json")));
  EXPECT_EQ(index["weight_map"].size(), w.params.size());
  EXPECT_EQ(index["weight_map"]["lm_head.weight"], (*files)[files->size() - 4]);
  EXPECT_EQ(nlohmann::json::parse(testing::ReadFile(dir.Join("bf16/config.json")))["torch_dtype"], "bfloat16");
  auto back = LoadWeights(dir.Join("bf16"), nullptr);
  ASSERT_TRUE(back.ok()) << back.status();
  for (size_t i = 0; i < w.params.size(); ++i) {
    const auto want = w.params[i].second.to(torch::kBFloat16).to(torch::kFloat32);
    EXPECT_TRUE(torch::equal(back->params[i].second, want)) << w.params[i].first;
  }
  EXPECT_EQ(back->params[0].second.view({-1})[0].item<float>(), 1.0f);
  EXPECT_EQ(back->params[0].second.view({-1})[1].item<float>(), 1.0f + 4.0f / 256);
}

// What does not fit is refused by name: a config.json whose sizes the tensors do not have, keys
// atoll's Llama cannot be, a tensor the model lacks.
TEST(HfFormatTest, DirectoriesThatDoNotFitAreRefusedByName) {
  TempDir dir;
  const auto m = SmallLlama();
  ASSERT_TRUE(hf::Write(WeightsOf(m), dir.Join("d"), {}).ok());
  const std::string path = dir.Join("d/config.json");
  const auto original = nlohmann::json::parse(testing::ReadFile(path));
  auto with = [&](const std::string& key, const nlohmann::json& value) {
    auto j = original;
    j[key] = value;
    testing::WriteFile(path, j.dump());
    return LoadWeights(dir.Join("d"), nullptr).status();
  };
  auto s = with("intermediate_size", 32);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("model.layers.0.mlp.gate_proj.weight has shape [24,16], "
                                                  "the model of config.json needs [32,16]"));
  s = with("rope_scaling", nlohmann::json{{"rope_type", "llama3"}, {"factor", 8.0}});
  EXPECT_THAT(std::string(s.message()), HasSubstr("rope_scaling"));
  s = with("attention_bias", true);
  EXPECT_THAT(std::string(s.message()), HasSubstr("attention_bias = true"));
  s = with("num_key_value_heads", 3);
  EXPECT_THAT(std::string(s.message()), HasSubstr("model.n_kv_head (3)"));
  s = with("architectures", nlohmann::json::array({"BertModel"}));
  EXPECT_THAT(std::string(s.message()), HasSubstr("GPT2LMHeadModel and LlamaForCausalLM"));
  testing::WriteFile(path, original.dump());
  // A tensor of another model beside the weights.
  auto w = WeightsOf(m);
  w.params.emplace_back("layers.0.self_attn.q_norm.weight", torch::ones({4}));
  ASSERT_TRUE(hf::Write(w, dir.Join("extra"), {}).ok());
  s = LoadWeights(dir.Join("extra"), nullptr).status();
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("model.layers.0.self_attn.q_norm.weight (in model.safetensors) is not a parameter"));
}

// An independent reader of an exported Llama directory (tests/src/store/hf_llama_reference.py: numpy in
// float64, written from Hugging Face's definition of LlamaForCausalLM, no code shared with atoll)
// continues a prompt greedily as `atoll generate` does from the same directory, token for token:
// names, layouts, the rotary convention, grouped-query attention and the tied head are Hugging
// Face's. (transformers itself is not packaged for Debian 12.)
TEST(HfFormatTest, AnIndependentReaderGeneratesWhatAtollGenerates) {
  // Debian's python3 (and its python3-numpy), whatever else is first on PATH.
  if (testing::RunCommand("/usr/bin/python3 -c 'import numpy'").exit_code != 0) {
    GTEST_SKIP() << "python3-numpy is not installed (deploy/test.sh installs it)";
  }
  TempDir dir;
  torch::manual_seed(5);  // the scaled weights below: the same in every run (unseeded, they vary)
  for (const bool tied : {false, true}) {
    auto m = SmallLlama(tied);
    m.context = 32;  // the prompt and the continuation fit: no window slides
    ModelWeights w = WeightsOf(m);
    // Weights 25 x init's scale: peaked logits that follow the context (no argmax is a near tie
    // between float32 and float64 arithmetic, and the continuation varies); norm gains not all 1.
    for (auto& [name, t] : w.params) {
      if (absl::EndsWith(name, "norm.weight")) {
        t.uniform_(0.5, 1.5);
      } else {
        t.mul_(25);
      }
    }
    const std::string out = dir.Join(tied ? "tied" : "untied");
    ASSERT_TRUE(hf::Write(w, out, {}).ok());
    const auto atoll =
        AtollStdout("generate --checkpoint " + out + " --prompt 'islands ' --temperature 0 --tokens 20");
    ASSERT_EQ(atoll.exit_code, 0) << atoll.output;
    ASSERT_EQ(atoll.output.size(), 8u + 20u + 1u) << atoll.output;
    std::string want;
    std::set<int> distinct;
    for (size_t i = 8; i < 28; ++i) {
      absl::StrAppend(&want, int(uint8_t(atoll.output[i])), "\n");
      distinct.insert(uint8_t(atoll.output[i]));
    }
    EXPECT_GE(distinct.size(), 4u) << "a continuation that says little: " << want;
    const auto reference = testing::RunCommand("/usr/bin/python3 " ATOLL_SOURCE_DIR "/tests/src/store/hf_llama_reference.py " +
                                               out + " 'islands ' 20");
    ASSERT_EQ(reference.exit_code, 0) << reference.output;
    EXPECT_EQ(reference.output, want) << (tied ? "tied" : "untied");
  }
}

}  // namespace
}  // namespace atl
