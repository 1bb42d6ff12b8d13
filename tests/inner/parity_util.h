// Parity runs: an island of N ranks (forked processes over c10d Gloo on loopback) trained on a
// mesh, its losses and merged parameters, and the comparison with one rank on the same global
// batch. Shared by the parallelism tests of every model family.
#ifndef ATOLL_TESTS_INNER_PARITY_UTIL_H_
#define ATOLL_TESTS_INNER_PARITY_UTIL_H_

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "inner/parallel/parallelism_config.h"
#include "src/config/config.h"
#include "tests/test_util.h"

namespace atl::testing {

struct TrainingRun {
  std::vector<double> losses;
  std::map<std::string, torch::Tensor> params;  // whole tensors, merged from the ranks' slices
};

// Trains `ranks` ranks (mesh from `parallelism`) for `steps` steps, from the checkpoint `resume`
// if given, and returns rank 0's losses and the parameters (the checkpoint it writes, merged).
TrainingRun TrainIsland(const Config& c, int ranks, inner::parallel::ParallelismConfig parallelism,
                        const TempDir& dir, const std::string& name, int steps = 20,
                        const std::string& resume = "");

// Every loss to 1e-5 relative and every parameter to `param_tolerance` relative (the key bias of
// GPT-2's attention, whose gradient is identically zero, to 1e-5 absolute).
void ExpectParity(const TrainingRun& got, const TrainingRun& want, const std::string& what,
                  double param_tolerance = 1e-5);

// dp_shard x tp (x dp_replicate x pp) ranks.
inner::parallel::ParallelismConfig Mesh(int shard, int tp = 1, int replicate = 1, int pp = 1);

}  // namespace atl::testing

#endif  // ATOLL_TESTS_INNER_PARITY_UTIL_H_
