// One device's throughput and MFU for GPTs of about 125M and 1B parameters and a ~1B Llama (bf16
// autocast, fp32 weights and AdamW, fused attention), and the cost of an outer round of each against H = 100 of
// its inner steps, measured on the code the islands run (inner::Trainer, TensorDeviceCopy with the
// CUDA codecs; the host path for comparison).
//
//   build/tests/bench/gpu_bench [--device cuda] [--models 125m,1b,llama-1b] [--steps 10] [--peak-tflops 989.4]
//                               [--fragments 4] [--codec fp4_e2m1] [--precision bf16]
//   build/tests/bench/gpu_bench --device cpu --models tiny --steps 2     (a smoke run on CPUs)
//
// MFU = model FLOPs per token x tokens/s / peak FLOP/s, with model FLOPs per token = 6 N + 12 L d T
// (N: the parameters of matrix products, i.e. the blocks' and the LM head's, not the embedding
// tables; L layers of width d over a context of T: the attention scores and their product with V,
// forward and backward, counted whole as in PaLM's appendix B). For Llama the same formula holds
// term by term: SwiGLU's three matrices (gate, up, down: 3 d ffn_hidden) are in N, grouped-query
// attention's narrower k and v projections (2 d n_kv_head head_dim) are in N at their own size,
// and the attention term stays 12 L d T, since the scores and their product with V are computed for
// every query head (the key/value heads are shared, not the products); a tied head counts once. The peak defaults to the H100 /
// H200 SXM dense bf16 figure; an 8192^3 bf16 matrix product measured in the same run is printed
// beside it, with the MFU against it.
//
// The outer round (per round, all fragments): capture (global - local on the compute stream),
// encode (FP4 on the engine's stream, the encoded bytes copied to the host), apply (an update's
// encoded chunks decoded and subtracted on the device), merge (alpha = 0.5 on the compute stream).
// Their sum against 100 x the step time is the overhead if none of it overlapped training;
// capture + merge are what the compute stream itself spends.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "compression/codec.h"
#include "inner/parallel/fsdp.h"
#include "inner/trainer.h"
#include "outer/base/fragments.h"
#include "outer/base/payload.h"
#include "src/island/tensor_device_copy.h"
#include "tests/test_util.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace inner = atl::inner;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void Sync(const at::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

struct Options {
  std::string device = "cuda";
  std::vector<std::string> models = {"125m", "1b", "llama-1b"};
  int steps = 10;
  double peak_tflops = 989.4;
  int fragments = 4;
  std::string codec = "fp4_e2m1";
  std::string precision = "bf16";
};

struct Preset {
  inner::ModelConfig model;
  int batch = 8;
};

inner::ModelConfig Gpt(int n_layer, int d_model, int n_head, int context, int vocab) {
  inner::ModelConfig m;
  m.n_layer = n_layer;
  m.d_model = d_model;
  m.n_head = n_head;
  m.context = context;
  m.vocab = vocab;
  return m;
}

inner::ModelConfig Llama(int n_layer, int d_model, int n_head, int n_kv_head, int ffn_hidden,
                         int context, int vocab) {
  inner::ModelConfig m = Gpt(n_layer, d_model, n_head, context, vocab);
  m.arch = "llama";
  m.n_kv_head = n_kv_head;
  m.ffn_hidden = ffn_hidden;
  return m;
}

std::map<std::string, Preset> Presets() {
  std::map<std::string, Preset> p;
  // GPT-2 small's shape (with an untied LM head), and a 1B GPT of 16 layers of width 2048.
  p["125m"] = {Gpt(12, 768, 12, 1024, 50304), 16};
  p["1b"] = {Gpt(16, 2048, 16, 2048, 50304), 8};
  // Llama 3.2 1B's blocks (16 layers of 2048, 32 query heads sharing 8 key/value heads, SwiGLU
  // 8192) with Llama 2's 32000-token vocabulary and an untied head: 1.10B parameters.
  p["llama-1b"] = {Llama(16, 2048, 32, 8, 8192, 2048, 32000), 8};
  p["tiny"] = {Gpt(4, 64, 2, 64, 256), 4};
  p["llama-tiny"] = {Llama(4, 64, 4, 2, 176, 64, 256), 4};
  return p;
}

double MatmulFlopsPerToken(const inner::ModelConfig& m) {
  double matmul_params = 0;
  for (const auto& [name, shape] : inner::ParameterShapes(m)) {
    const bool lookup = name == "tok_emb.weight" || name == "pos_emb.weight" || name == "embed_tokens.weight";
    if (lookup || shape.size() != 2) continue;
    matmul_params += double(shape[0]) * double(shape[1]);
  }
  return 6 * matmul_params + 12.0 * m.n_layer * m.d_model * m.context;
}

// bf16 matrix product rate on this device (TFLOP/s), median of 5 after warm-up.
double MeasuredMatmulTflops(const at::Device& device) {
  const int64_t n = device.is_cuda() ? 8192 : 512;
  auto o = torch::TensorOptions().device(device).dtype(torch::kBFloat16);
  auto a = torch::randn({n, n}, o), b = torch::randn({n, n}, o);
  for (int i = 0; i < 3; ++i) torch::matmul(a, b);
  Sync(device);
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    for (int k = 0; k < 10; ++k) torch::matmul(a, b);
    Sync(device);
    t.push_back(Since(t0) / 10);
  }
  std::sort(t.begin(), t.end());
  return 2.0 * double(n) * n * n / t[2] / 1e12;
}

struct RoundCost {
  double capture_s = 0, encode_s = 0, apply_s = 0, merge_s = 0;  // device path
  double snapshot_s = 0, host_encode_s = 0, host_merge_s = 0;    // host path
  uint64_t encoded_bytes = 0;
};

// The host path of one fragment's round, as ShardModel::Snapshot, IslandSync's push and
// ShardModel::Merge do it (the same operations written out here, without a service): a copy of
// the parameters to the host, global - local and the encoding there (one thread, as one
// fragment's push task), the merge from a host copy.
absl::Status MeasureHostPath(const std::vector<at::Tensor>& parts, std::vector<float>& global,
                             const atl::compression::CodecSpec& spec,
                             const atl::outer::ChunkPlan& chunks, const at::Device& device,
                             std::vector<std::string>& encoded, RoundCost& cost) {
  const uint64_t n = global.size();
  auto t0 = Clock::now();
  std::vector<float> local;
  local.reserve(n);
  for (const auto& p : parts) {
    auto h = p.to(torch::kCPU).contiguous();
    local.insert(local.end(), h.data_ptr<float>(), h.data_ptr<float>() + h.numel());
  }
  cost.snapshot_s += Since(t0);
  t0 = Clock::now();
  std::vector<float> delta(chunks.per_chunk);
  for (uint64_t c = 0; c < chunks.num_chunks; ++c) {
    const uint64_t at = c * chunks.per_chunk, k = std::min(chunks.per_chunk, n - at);
    for (uint64_t i = 0; i < k; ++i) delta[i] = global[at + i] - local[at + i];
    if (auto s = atl::compression::Encode(spec, delta.data(), k,
                                          reinterpret_cast<uint8_t*>(encoded[c].data()));
        !s.ok()) {
      return s;
    }
  }
  cost.host_encode_s += Since(t0);
  t0 = Clock::now();
  {
    torch::NoGradGuard no_grad;
    uint64_t at = 0;
    for (auto p : parts) {
      auto src = torch::from_blob(global.data() + at, {p.numel()}, torch::kFloat);
      p.mul_(0.5).add_(src.to(p.device()), 0.5);
      at += uint64_t(p.numel());
    }
  }
  Sync(device);
  cost.host_merge_s += Since(t0);
  return absl::OkStatus();
}

// One outer round of every fragment, on the device path and on the host path.
absl::StatusOr<RoundCost> MeasureRound(inner::Trainer& trainer, const Options& o,
                                       const at::Device& device) {
  auto spec = atl::compression::ParseCodec(o.codec);
  if (!spec.ok()) return spec.status();
  auto& shards = trainer.sharded().shards();
  std::vector<std::string> names;
  for (const auto& s : shards) names.push_back(s.name);
  auto plan = atl::outer::PlanFragments(
      atl::inner::FragmentGroups(trainer.sharded().plan(), names), o.fragments,
      atl::outer::FragmentPattern::kStrided);
  if (!plan.ok()) return plan.status();
  RoundCost cost;
  for (const auto& members : plan->parameters) {
    uint64_t n = 0;
    for (size_t i : members) n += uint64_t(shards[i].value.numel());
    auto parts = [&shards, members] {
      std::vector<at::Tensor> out;
      for (size_t i : members) out.push_back(shards[i].value);
      return out;
    };
    // The parameters' own device ("cuda" resolves to the rank's, cuda:0 here).
    auto copy = atl::TensorDeviceCopy::Create(parts, n, shards[members.front()].value.device());
    if (!copy.ok()) return copy.status();
    // The global copy: the parameters as they are, moved a little (a round's worth of drift).
    std::vector<float> global;
    global.reserve(n);
    for (const auto& p : parts()) {
      auto h = (p + 1e-3 * torch::randn_like(p)).to(torch::kCPU).contiguous();
      global.insert(global.end(), h.data_ptr<float>(), h.data_ptr<float>() + h.numel());
    }
    if (auto s = (*copy)->Load(global); !s.ok()) return s;
    const auto chunks = atl::outer::PlanChunks(*spec, n);
    Sync(device);

    auto t0 = Clock::now();
    if (auto s = (*copy)->Capture(false); !s.ok()) return s;
    Sync(device);
    cost.capture_s += Since(t0);

    std::vector<std::string> encoded(chunks.num_chunks);
    std::vector<float> exact(64);
    t0 = Clock::now();
    for (uint64_t c = 0; c < chunks.num_chunks; ++c) {
      const uint64_t at = c * chunks.per_chunk, k = std::min(chunks.per_chunk, n - at);
      encoded[c].resize(atl::compression::EncodedBytes(*spec, k));
      if (auto s = (*copy)->Encode(*spec, at, k, {}, reinterpret_cast<uint8_t*>(encoded[c].data()),
                                   exact.data(), exact.size());
          !s.ok()) {
        return s;
      }
      cost.encoded_bytes += encoded[c].size();
    }
    cost.encode_s += Since(t0);

    // The pseudo-gradient's encoding stands in for the service's update (same codec, same size).
    t0 = Clock::now();
    for (uint64_t c = 0; c < chunks.num_chunks; ++c) {
      const uint64_t at = c * chunks.per_chunk, k = std::min(chunks.per_chunk, n - at);
      if (auto s = (*copy)->Apply(*spec, at, k, encoded[c]); !s.ok()) return s;
    }
    cost.apply_s += Since(t0);

    t0 = Clock::now();
    (*copy)->MergeInto(0.5);
    Sync(device);
    cost.merge_s += Since(t0);

    if (auto s = MeasureHostPath(parts(), global, *spec, chunks, device, encoded, cost); !s.ok()) return s;
  }
  return cost;
}

int RunModel(const std::string& name, const Preset& preset, const Options& o, double matmul_tflops) {
  const at::Device device(o.device);
  auto corpus = inner::TokenCorpus::FromText(atl::testing::GeneratedText(8 << 20, 3));
  auto data = inner::MakeDataset(corpus, nullptr, 0.01, preset.model.context, 1);
  if (!data.ok()) {
    std::fprintf(stderr, "%s\n", std::string(data.status().message()).c_str());
    return 1;
  }
  inner::OptimConfig optim;
  optim.warmup_steps = 0;
  inner::TrainConfig train;
  train.steps = 1000;
  train.batch_size = preset.batch;
  train.device = o.device;
  train.mixed_precision =
      o.precision == "bf16" ? inner::MixedPrecision::kBf16 : inner::MixedPrecision::kNone;
  inner::TrainerConfig trainer_config;
  trainer_config.model = preset.model;
  trainer_config.optim = optim;
  trainer_config.train = train;
  auto trainer = inner::Trainer::Create(trainer_config, *data);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(trainer.status().message()).c_str());
    return 1;
  }
  for (int i = 0; i < 3; ++i) {
    if (auto s = (*trainer)->Step(); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.status().message()).c_str());
      return 1;
    }
  }
  Sync(device);
  const auto t0 = Clock::now();
  // The steps queue without waiting for the device, as in an island: their stats come over at
  // the end, in one copy.
  for (int i = 0; i < o.steps; ++i) {
    if (auto s = (*trainer)->QueueStep(); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  auto stats = (*trainer)->TakeStats();
  if (!stats.ok() || stats->empty()) return 1;
  const double loss = stats->back().loss;
  Sync(device);
  const double step_s = Since(t0) / o.steps;
  const double tokens_per_step = double(preset.batch) * preset.model.context;
  const double tokens_per_s = tokens_per_step / step_s;
  const double flops = MatmulFlopsPerToken(preset.model) * tokens_per_s;
  const int64_t params = inner::ParameterCount(preset.model);
  auto cost = MeasureRound(**trainer, o, device);
  if (!cost.ok()) {
    std::fprintf(stderr, "%s: outer round: %s\n", name.c_str(),
                 std::string(cost.status().message()).c_str());
    return 1;
  }
  const double h100 = 100 * step_s;
  const double device_round = cost->capture_s + cost->encode_s + cost->apply_s + cost->merge_s;
  const double host_round = cost->snapshot_s + cost->host_encode_s + cost->host_merge_s;
  std::printf("| %s | %.1fM | %d x %d | %s | %.0f | %.1f%% | %.1f%% | %.1f | %.1f | %.1f %.1f %.1f %.1f | %.3f%% (%.3f%%) | %.1f %.1f %.1f | %.2f%% | %.3f |\n",
              name.c_str(), double(params) / 1e6, preset.batch, preset.model.context,
              o.precision.c_str(), tokens_per_s, 100 * flops / (o.peak_tflops * 1e12),
              100 * flops / (matmul_tflops * 1e12), 1e3 * step_s, 1e3 * device_round,
              1e3 * cost->capture_s, 1e3 * cost->encode_s, 1e3 * cost->apply_s,
              1e3 * cost->merge_s, 100 * device_round / h100,
              100 * (cost->capture_s + cost->merge_s) / h100, 1e3 * cost->snapshot_s,
              1e3 * cost->host_encode_s, 1e3 * cost->host_merge_s, 100 * host_round / h100, loss);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    bool ok = true;
    if (flag == "--device") {
      o.device = value;
    } else if (flag == "--models") {
      o.models = absl::StrSplit(value, ',');
    } else if (flag == "--steps") {
      ok = absl::SimpleAtoi(value, &o.steps) && o.steps > 0;
    } else if (flag == "--peak-tflops") {
      ok = absl::SimpleAtod(value, &o.peak_tflops) && o.peak_tflops > 0;
    } else if (flag == "--fragments") {
      ok = absl::SimpleAtoi(value, &o.fragments) && o.fragments > 0;
    } else if (flag == "--codec") {
      o.codec = value;
    } else if (flag == "--precision") {
      o.precision = value;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "gpu_bench: bad %s %s (see the comment at the top of gpu_bench.cc)\n",
                   flag.c_str(), value.c_str());
      return 2;
    }
  }
  if (o.device.rfind("cuda", 0) == 0 && !torch::cuda::is_available()) {
    std::fprintf(stderr, "gpu_bench: no CUDA device (--device cpu for a smoke run)\n");
    return 2;
  }
  const double matmul = MeasuredMatmulTflops(at::Device(o.device));
  std::printf("gpu_bench: %s, peak %.1f TFLOP/s (MFU's denominator), a bf16 matrix product here "
              "%.1f TFLOP/s; %d fragments, %s; %d timed steps after 3\n",
              o.device.c_str(), o.peak_tflops, matmul, o.fragments, o.codec.c_str(), o.steps);
  std::printf("| model | params | batch x T | precision | tokens/s | MFU | MFU vs matmul | step ms "
              "| round ms | capture encode apply merge ms | round / 100 steps (compute stream) "
              "| host path: snapshot encode merge ms | host round / 100 steps | loss |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const auto presets = Presets();
  int rc = 0;
  for (const auto& m : o.models) {
    auto it = presets.find(m);
    if (it == presets.end()) {
      std::fprintf(stderr, "gpu_bench: unknown model %s (125m, 1b, tiny)\n", m.c_str());
      return 2;
    }
    rc |= RunModel(m, it->second, o, matmul);
  }
  return rc;
}
