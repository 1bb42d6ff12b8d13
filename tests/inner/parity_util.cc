#include "tests/inner/parity_util.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "inner/parallel/mesh.h"
#include "inner/trainer.h"
#include "src/store/checkpoint.h"
#include "tests/rank_util.h"

namespace atl::testing {

using inner::LoadDataset;
using inner::Trainer;
using inner::parallel::DeviceMesh;
using inner::parallel::ParallelismConfig;
using inner::parallel::RankInfo;
namespace parallel = inner::parallel;

// Trains `ranks` ranks (mesh from `parallelism`) for `steps` steps, from the checkpoint `resume`
// if given, and returns rank 0's losses and the parameters (the checkpoint it writes, merged).
TrainingRun TrainIsland(const Config& c, int ranks, ParallelismConfig parallelism,
                        const TempDir& dir, const std::string& name, int steps,
                        const std::string& resume) {
  const std::string ckpt = dir.Join(name + "-ckpt"), losses = dir.Join(name + "-losses");
  const auto codes = RunRanks(ranks, [&](const RankInfo& info) {
    auto shape = parallel::ResolveMesh(parallelism, info.world_size);
    if (!shape.ok()) return 10;
    auto mesh = DeviceMesh::Create(*shape, info, false, std::chrono::seconds(30));
    if (!mesh.ok()) return 11;
    auto data = LoadDataset(c.data, c.model.context, c.model.vocab);
    if (!data.ok()) return 12;
    auto t = Trainer::Create(c.trainer(), *data, 0, 1, mesh->get());
    if (!t.ok()) return 13;
    if (!resume.empty()) {
      auto from = ReadCheckpoint(resume);
      if (!from.ok() || !(*t)->ImportState(from->state).ok()) return 16;
    }
    std::ofstream out(losses + "." + std::to_string(info.rank));
    for (int i = 0; i < steps; ++i) {
      auto s = (*t)->Step();
      if (!s.ok()) {
        std::fprintf(stderr, "%s rank %d: %s\n", name.c_str(), info.rank,
                     std::string(s.status().message()).c_str());
        return 14;
      }
      out << std::hexfloat << s->loss << "\n";
    }
    out.close();
    return WriteCheckpointShard(ckpt, info.rank, info.world_size, (*t)->ExportState(), {}).ok()
               ? 0
               : 15;
  });
  EXPECT_EQ(codes, std::vector<int>(size_t(ranks), 0)) << name;
  TrainingRun run;
  std::ifstream in(losses + ".0");
  for (std::string line; std::getline(in, line);) run.losses.push_back(std::strtod(line.c_str(), nullptr));
  auto merged = ReadCheckpoint(ckpt);
  EXPECT_TRUE(merged.ok()) << merged.status();
  if (!merged.ok()) return run;
  for (const auto& s : merged->state.tensors) {
    if (s.name.rfind("model/", 0) != 0) continue;
    auto& whole = run.params[s.name];
    int64_t numel = 1;
    for (int64_t d : s.shape) numel *= d;
    if (!whole.defined()) whole = torch::full({numel}, NAN);
    whole.narrow(0, s.offset, s.values.numel()).copy_(s.values);
  }
  return run;
}

void ExpectParity(const TrainingRun& got, const TrainingRun& want, const std::string& what,
                  double param_tolerance) {
  ASSERT_FALSE(want.losses.empty()) << what << ": the reference trained nothing";
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  double worst_loss = 0, worst_param = 0;
  for (size_t i = 0; i < got.losses.size(); ++i) {
    const double rel = std::abs(got.losses[i] - want.losses[i]) / std::abs(want.losses[i]);
    worst_loss = std::max(worst_loss, rel);
    EXPECT_LT(rel, 1e-5) << what << ": loss of step " << i + 1;
  }
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  auto relative = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a - b).norm().item<double>() / std::max(1e-12, b.norm().item<double>());
  };
  for (const auto& [name, w] : want.params) {
    const auto& g = got.params.at(name);
    ASSERT_FALSE(torch::isnan(g).any().item<bool>()) << what << ": " << name << " not covered";
    if (name.find("attn.qkv.bias") == std::string::npos) {
      worst_param = std::max(worst_param, relative(g, w));
      EXPECT_LT(relative(g, w), param_tolerance) << what << ": " << name;
      continue;
    }
    // The key bias has an identically zero gradient (softmax ignores a shift shared by all keys):
    // its value is rounding noise that AdamW amplifies, whatever the order of the sums, so it is
    // held to an absolute bound; the query and value biases to the relative one.
    auto gs = g.view({3, -1}), ws = w.view({3, -1});
    for (int part : {0, 2}) {
      worst_param = std::max(worst_param, relative(gs[part], ws[part]));
      EXPECT_LT(relative(gs[part], ws[part]), 1e-5) << what << ": " << name << " part " << part;
    }
    EXPECT_LT((gs[1] - ws[1]).abs().max().item<double>(), 1e-5) << what << ": " << name << " (key)";
  }
  std::printf("%s: worst relative error %.2e (losses), %.2e (parameters)\n", what.c_str(),
              worst_loss, worst_param);
  std::fflush(stdout);  // before the next run forks its ranks
}

// dp_shard x tp (x dp_replicate x pp) ranks.
ParallelismConfig Mesh(int shard, int tp, int replicate, int pp) {
  ParallelismConfig p;
  p.data_parallel_shard_degree = shard;
  p.tensor_parallel_degree = tp;
  p.data_parallel_replicate_degree = replicate;
  p.pipeline_parallel_degree = pp;
  return p;
}


}  // namespace atl::testing
