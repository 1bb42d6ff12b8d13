// Writes the seed corpus of every fuzz harness from the real encoders and writers, so seeds follow
// the formats: make_seeds DIR writes DIR/<harness>/seed-N. Run it again when a format changes
// (tests/fuzz/corpus is its output).
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "outer/base/payload.h"
#include "outer/service/sync_server.h"
#include "src/store/checkpoint.h"
#include "src/config/config.h"
#include "src/service/coordinator.h"
#include "tests/fuzz/fuzz_input.h"

namespace pb = ::atollpb::v1;
using namespace atl;

namespace {

std::string root;
int written = 0;

void Seed(const std::string& harness, const std::string& bytes) {
  std::filesystem::create_directories(root + "/" + harness);
  const std::string path = root + "/" + harness + "/seed-" + std::to_string(written++);
  std::ofstream(path, std::ios::binary) << bytes;
}

template <typename T>
std::string Le(T v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof(T));
}

std::vector<float> Values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

const char* kCodecs[] = {"fp32", "bf16", "int8", "fp4_e2m1", "fp4_e3m0"};

void CodecSeeds() {
  std::vector<compression::CodecSpec> specs;
  for (const char* name : kCodecs) specs.push_back(*compression::ParseCodec(name));
  for (const char* name : {"int2", "fp4_e2m1", "fp32"}) {  // sparse: top-3 of chunks of 64
    specs.push_back(*compression::MakeSpec(int(compression::ParseCodec(name)->codec), 64, 3));
  }
  for (const auto& spec : specs) {
    const uint16_t n = 100;
    const auto v = Values(n, n);
    std::string payload(compression::EncodedBytes(spec, n), '\0');
    (void)compression::Encode(spec, v.data(), n, reinterpret_cast<uint8_t*>(payload.data()));
    Seed("codec", Le(uint8_t(int(spec.codec) - 1)) + Le(uint16_t(spec.block_size)) + Le(n) +
                      Le(uint16_t(10)) + Le(uint16_t(50)) + Le(uint8_t(0)) +
                      Le(uint16_t(spec.topk)) + payload);
  }
}

void PayloadSeeds() {
  for (const char* name : kCodecs) {
    const auto spec = *compression::ParseCodec(name);
    const uint64_t n = 300;
    const auto v = Values(n, 7);
    auto chunks = *outer::EncodeChunks({"run", "a", 3, 1}, spec, v.data(), 0, n, n, 128);
    std::string input = Le(uint8_t(0)) + Le(uint8_t(int(spec.codec) - 1)) +
                        Le(uint16_t(spec.block_size)) + Le(uint16_t(n - 1));
    for (const auto& c : chunks) fuzz::AppendRecord(input, c.SerializeAsString());
    Seed("payload", input);
  }
}

void PushSeeds() {
  for (const char* name : {"fp32", "fp4_e2m1"}) {
    const auto spec = *compression::ParseCodec(name);
    for (uint8_t async : {0, 16}) {
      const auto v = Values(64, 9);
      auto chunks = *outer::EncodeChunks({"run", "a", 0, 0}, spec, v.data(), 0, 64, 64, 64);
      std::string input = Le(uint8_t(4 | async | (spec.codec == compression::Codec::kFp32 ? 0 : 8)));
      for (auto& c : chunks) {
        pb::PushRequest r;
        *r.mutable_chunk() = c;
        r.set_tokens(100);
        fuzz::AppendRecord(input, r.SerializeAsString());
      }
      Seed("push", input);
    }
  }
}

void ConfigSeeds() {
  Config c;
  c.data.path = "data.txt";
  std::string input;
  fuzz::AppendRecord(input, ToToml(c));
  fuzz::AppendRecord(input, "--outer.aggregation=median");
  fuzz::AppendRecord(input, "--train.steps");
  fuzz::AppendRecord(input, "12");
  Seed("config", input);
  std::string small;
  fuzz::AppendRecord(small,
                     "[model]\nn_layer = 2\nd_model = 32\n[data]\npath = \"x\"\n[outer]\n"
                     "codec = \"fp4_e2m1\"\nnum_fragments = 2\nmode = \"async\"\n");
  Seed("config", small);
}

void CheckpointSeeds() {
  inner::TrainerState state;
  state.step = 12;
  state.adam_step = 12;
  state.cursor = {1, 5};
  state.tensors.push_back({"model/w", torch::arange(6, torch::kFloat).view({2, 3})});
  state.tensors.push_back({"optim/exp_avg/w", torch::ones({2, 3})});
  state.rng_state = torch::zeros({16}, torch::kByte);
  const std::string path = root + "/tmp.ckpt";
  if (!WriteCheckpoint(path, state, {1.5, "[model]\n"}).ok()) std::abort();
  std::ifstream in(path, std::ios::binary);
  const std::string file(std::istreambuf_iterator<char>(in), {});
  std::filesystem::remove(path);
  Seed("checkpoint", Le(uint8_t(0)) + file);  // even: the file as it is (the flag byte leads it)
  // Odd: the header and the data region, which the harness reassembles with valid checksums.
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data() + 8, 8);
  std::string input = Le(uint8_t(1));
  fuzz::AppendRecord(input, file.substr(24, header_len));
  input += file.substr((24 + header_len + 63) / 64 * 64);
  Seed("checkpoint", input);
}

void ServiceStateSeeds() {
  for (int delay : {0, 2}) {
    outer::SyncServerOptions o;
    o.run_id = "run";
    o.config_hash = 7;
    o.optimizer.momentum_delay = delay;
    outer::SyncServer server(o, {{{"w"}, {5}}, {{"v"}, {3}}},
                             {std::vector<float>(5, 1.0f), std::vector<float>(3, 2.0f)});
    const std::string path = root + "/tmp.state";
    auto description = WriteServiceState(path, server);
    if (!description.ok()) std::abort();
    std::ifstream in(path, std::ios::binary);
    const std::string file(std::istreambuf_iterator<char>(in), {});
    Seed("service_state", Le(uint8_t(0)) + file);
    std::filesystem::remove(path);
    // The same as a description record and the tensor data (the harness writes the file).
    std::string input = Le(uint8_t(1));
    const std::string footer = description->SerializeAsString();
    fuzz::AppendRecord(input, footer);
    input += file.substr(8, file.size() - 8 - footer.size() - 24);
    Seed("service_state", input);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  root = argv[1];
  CodecSeeds();
  PayloadSeeds();
  PushSeeds();
  ConfigSeeds();
  CheckpointSeeds();
  ServiceStateSeeds();
  std::printf("%d seeds in %s\n", written, root.c_str());
  return 0;
}
