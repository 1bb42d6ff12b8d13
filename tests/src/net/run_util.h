// Multi-process runs for the tests of a test executable built with ATOLL_BIN (the atoll binary):
// a coordinator and two islands (`atoll local`) on a small generated text, and what the service
// logged of them.
#ifndef ATOLL_TESTS_SRC_NET_RUN_UTIL_H_
#define ATOLL_TESTS_SRC_NET_RUN_UTIL_H_

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace atl::testing {

// `atoll local --islands 2` on a 4-layer model for 12 steps (unless `extra_args` says otherwise),
// with `outer_toml` as the [outer] section.
inline CommandResult RunTwoIslands(const TempDir& dir, const std::string& outer_toml,
                                   const std::string& extra_args = "") {
  WriteFile(dir.Join("text.txt"), GeneratedText(60000, 9));
  WriteFile(dir.Join("run.toml"),
            "[model]\nn_layer = 4\nd_model = 32\nn_head = 2\ncontext = 32\n"
            "[data]\npath = \"" + dir.Join("text.txt") + "\"\nval_fraction = 0.1\n"
            "[train]\nsteps = 12\nbatch_size = 4\neval_every = 8\neval_batches = 2\n"
            "threads = 1\n[optim]\nwarmup_steps = 2\n[outer]\n" + outer_toml);
  return RunCommand(std::string(ATOLL_BIN) + " local --islands 2 --config " + dir.Join("run.toml") +
                    " --run-dir " + dir.Join("run") + " " + extra_args);
}

// An island's summary.json.
inline nlohmann::json IslandSummary(const TempDir& dir, const std::string& island) {
  return nlohmann::json::parse(ReadFile(dir.Join("run/" + island + "/summary.json")));
}

// The records of the service's rounds.jsonl (a sharded service: every shard's), in order.
inline std::vector<nlohmann::json> ServiceRounds(const TempDir& dir) {
  std::vector<nlohmann::json> out;
  for (const char* server : {"coordinator", "shard-0", "shard-1"}) {
    std::ifstream rounds(dir.Join(std::string("run/") + server + "/rounds.jsonl"));
    for (std::string line; std::getline(rounds, line);) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

// The service's hash after each round (version) of each fragment, in order.
inline std::map<int, std::vector<std::string>> ServiceHashes(const TempDir& dir) {
  std::map<int, std::vector<std::string>> service;
  for (const auto& j : ServiceRounds(dir)) {
    service[j["fragment"].get<int>()].push_back(j["params_hash"]);
  }
  return service;
}

}  // namespace atl::testing

#endif  // ATOLL_TESTS_SRC_NET_RUN_UTIL_H_
