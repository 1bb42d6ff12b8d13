// Memory and speed of an island's ranks (FSDP, tensor and pipeline parallelism over Gloo on this
// machine): for each mesh (N: dp_shard = N; tpT: tensor_parallel = T; ppP-gpipe / ppP-1f1b:
// pipeline stages in that schedule; tpT-sp: with sequence parallelism; combined with x, e.g.
// 2xtp2, pp2-1f1bx2) of one config, each rank's model-state bytes (parameter and gradient shards,
// AdamW moments, the full units gathered at the peak) against the formula (split params / T + whole params, of the largest stage) x
// (4 + 4 + 8) B / N + two of the largest unit (a pipelined stage: all its units), its peak RSS and
// the RSS the model adds, the island's tokens/s (the same `batch` sequences per data-parallel rank
// and step; a pipeline splits them into `micro` micro-batches) and, for pipelines, the measured
// bubble (the share of the step the stages wait for each other, mean over stages and steps)
// against (p - 1) / (m + p - 1). The ranks are forked processes; each writes one line of figures.
//
//   build/tests/bench/fsdp_bench [deploy/configs/small.toml] [steps=4] [batch=2] [meshes=1,2,4]
//                                [micro=4]
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "inner/parallel/fsdp.h"
#include "inner/parallel/mesh.h"
#include "inner/trainer.h"
#include "src/config/config.h"
#include "tests/rank_util.h"
#include "tests/test_util.h"

namespace {

int64_t StatusKb(const char* field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field, 0) == 0) return std::strtoll(line.c_str() + std::strlen(field), nullptr, 10);
  }
  return -1;
}

double MiB(int64_t bytes) { return double(bytes) / (1 << 20); }

struct Mesh {
  std::string name;
  int shard = 1, tp = 1, pp = 1;
  std::string schedule = "1F1B";
  bool sequence_parallel = false;
};

// The model state one rank of `mesh` should hold, in bytes.
double FormulaBytes(const atl::inner::ModelConfig& model, const Mesh& mesh_spec) {
  // What one rank holds: of its stage, the TP-split parameters' part and the whole ones; the
  // largest unit is the head (d x vocab) or a block (12 d^2 / T + 13 d).
  std::vector<double> held(size_t(mesh_spec.pp), 0.0);
  const int n_layer = model.n_layer;
  const auto plan = atl::inner::PlanOf(model);
  for (const auto& [name, shape] : atl::inner::ParameterShapes(model)) {
    double numel = 1;
    for (int64_t dim : shape) numel *= double(dim);
    const int unit = atl::inner::UnitOf(plan, name, n_layer);
    for (int st = 0; st < mesh_spec.pp; ++st) {
      const auto range = atl::inner::parallel::PipelineStageUnits(n_layer, mesh_spec.pp, st);
      if (unit < range.first || unit > range.last) continue;
      const bool whole = atl::inner::PlanOf(plan, name).style == atl::inner::TpStyle::kReplicated;
      held[size_t(st)] += whole ? numel : numel / mesh_spec.tp;
    }
  }
  const double stage = *std::max_element(held.begin(), held.end());
  const double d = model.d_model, v = model.vocab;
  const double unit = std::max({d * v + 2 * d, 12 * d * d / mesh_spec.tp + 13 * d,
                                v * d + model.context * d});
  // Parameters and gradients gathered: a unit's, twice at the peak; a pipelined stage's, all.
  const double gathered = mesh_spec.shard == 1 ? 0 : mesh_spec.pp > 1 ? stage * 8 : 2 * unit * 4;
  return stage * 16.0 / mesh_spec.shard + gathered;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string config_path =
      argc > 1 ? argv[1] : ATOLL_SOURCE_DIR "/deploy/configs/small.toml";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 4;
  const int batch = argc > 3 ? std::atoi(argv[3]) : 2;
  std::vector<Mesh> meshes = {{"1", 1, 1}, {"2", 2, 1}, {"4", 4, 1}};
  if (argc > 4) {
    meshes.clear();
    for (auto part : absl::StrSplit(argv[4], ',')) {
      Mesh m{std::string(part)};
      const std::vector<std::string> dims = absl::StrSplit(part, 'x');
      for (const auto& dim : dims) {
        int v = 0;
        if (dim.rfind("tp", 0) == 0 && absl::SimpleAtoi(dim.substr(2, dim.find('-') - 2), &v)) {
          m.tp = v;
          m.sequence_parallel = absl::EndsWith(dim, "-sp");
        } else if (dim.rfind("pp", 0) == 0 &&
                   absl::SimpleAtoi(dim.substr(2, dim.find('-') - 2), &v)) {
          m.pp = v;
          m.schedule = absl::StrContains(dim, "gpipe") ? "GPipe" : "1F1B";
        } else if (absl::SimpleAtoi(dim, &v)) {
          m.shard = v;
        }
      }
      meshes.push_back(m);
    }
  }
  const int micro = argc > 5 ? std::atoi(argv[5]) : 4;
  auto config = atl::LoadConfig(config_path, {{"data.path", "unused"}});
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  atl::testing::TempDir dir;
  atl::testing::WriteFile(dir.Join("text.txt"), atl::testing::GeneratedText(2 << 20, 5));
  config->data.path = dir.Join("text.txt");
  config->data.val_path = "";
  config->train.batch_size = batch;
  config->train.steps = steps + 1;
  config->train.eval_every = 0;
  config->optim.warmup_steps = 1;
  const double params = double(atl::inner::ParameterCount(config->model));
  std::printf("%s: %.2fM parameters, batch %d per rank, context %d, %d timed steps after one\n",
              config_path.c_str(), params / 1e6, batch, config->model.context, steps);
  std::printf("%12s %5s %10s %14s %12s %10s %13s %14s %7s %6s\n", "mesh", "ranks", "tokens/s",
              "state MiB/rank", "formula MiB", "ratio to 1", "peak RSS MiB", "model RSS MiB",
              "bubble", "ideal");
  double state_one = 0;
  for (const Mesh& mesh_spec : meshes) {
    const int n = mesh_spec.shard * mesh_spec.tp * mesh_spec.pp;
    const std::string out = dir.Join("mesh-" + mesh_spec.name);
    const auto codes = atl::testing::RunRanks(n, [&](const atl::inner::parallel::RankInfo& info) {
      const int64_t base_kb = StatusKb("VmRSS:");
      atl::inner::parallel::ParallelismConfig p;
      p.data_parallel_shard_degree = mesh_spec.shard;
      p.tensor_parallel_degree = mesh_spec.tp;
      p.pipeline_parallel_degree = mesh_spec.pp;
      p.sequence_parallel = mesh_spec.sequence_parallel;
      if (mesh_spec.pp > 1) {
        p.pipeline_microbatches = micro;
        if (!atl::inner::parallel::ParseConfigValue(mesh_spec.schedule, &p.pipeline_schedule).ok()) {
          return 9;
        }
      }
      auto trainer_config = config->trainer();
      trainer_config.parallelism = p;
      auto shape = atl::inner::parallel::ResolveMesh(p, n);
      auto mesh = atl::inner::parallel::DeviceMesh::Create(*shape, info, false,
                                                           std::chrono::seconds(120));
      if (!mesh.ok()) return 10;
      auto data = atl::inner::LoadDataset(config->data, config->model.context, config->model.vocab);
      if (!data.ok()) return 11;
      auto t = atl::inner::Trainer::Create(trainer_config, *data, 0, 1, mesh->get());
      if (!t.ok()) {
        std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
        return 12;
      }
      if (!(*t)->Step().ok()) return 13;  // warm-up
      const auto t0 = std::chrono::steady_clock::now();
      double bubble = 0;
      for (int i = 0; i < steps; ++i) {
        if (!(*t)->Step().ok()) return 14;
        bubble += (*t)->sharded().pipeline_timing().bubble() / steps;
      }
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const auto m = (*t)->sharded().memory();
      // Shards of parameters and gradients, AdamW's two moments of the parameter shard, the peak
      // of full units gathered.
      const int64_t state = m.shard_bytes + m.shard_bytes + m.peak_gathered_bytes;
      std::ofstream f(out + "." + std::to_string(info.rank));
      f << double((*t)->tokens_per_step()) * steps / wall << " " << state << " "
        << StatusKb("VmHWM:") << " " << base_kb << " " << bubble << "\n";
      return 0;
    });
    double tps = 0, bubble = 0;
    int64_t state = 0, hwm = 0, base = 0;
    for (int r = 0; r < n; ++r) {
      if (codes[size_t(r)] != 0) {
        std::printf("%5d rank %d failed (%d)\n", n, r, codes[size_t(r)]);
        continue;
      }
      std::ifstream f(out + "." + std::to_string(r));
      double rtps, rbubble;
      int64_t rstate, rhwm, rbase;
      f >> rtps >> rstate >> rhwm >> rbase >> rbubble;
      bubble += rbubble / n;
      tps = rtps;  // the island's tokens/s (every rank reports the same steps)
      state = std::max(state, rstate);
      hwm = std::max(hwm, rhwm);
      base = std::max(base, rbase);
    }
    const double formula = FormulaBytes(config->model, mesh_spec);
    if (n == 1) state_one = double(state);
    std::printf("%12s %5d %10.0f %14.1f %12.1f %10.2f %13.1f %14.1f", mesh_spec.name.c_str(), n,
                tps, MiB(state), formula / (1 << 20), double(state) / state_one,
                double(hwm) / 1024, double(hwm - base) / 1024);
    if (mesh_spec.pp > 1) {
      std::printf(" %7.3f %6.3f\n", bubble,
                  atl::inner::parallel::IdealBubble(mesh_spec.pp, micro));
    } else {
      std::printf(" %7s %6s\n", "-", "-");
    }
    std::fflush(stdout);
  }
  return 0;
}
