// The durable state of the service: snapshots for the writer, restoring one (all or nothing),
// and the gate that releases a round only once it is durable.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/checksum.h"
#include "compression/status_macros.h"
#include "outer/base/aggregation.h"
#include "outer/base/names.h"
#include "outer/service/sync_server.h"
#include "outer/service/sync_server_internal.h"

namespace atl::outer {

using internal::HashParams;

absl::StatusOr<pb::ServiceState> SyncServer::Snapshot(const StateWrite& write) const {
  pb::ServiceState s;
  s.set_run_id(options_.run_id);
  s.set_config_hash(options_.config_hash);
  for (uint32_t i = 0; i < fragments_.size(); ++i) {
    if (!ShardOwns(options_, i)) continue;  // a sharded service: another shard's
    const Fragment& f = fragments_[i];
    // The fragment's data as its last published commit left it; its next commit waits.
    std::lock_guard<std::mutex> data(*f.data_mu);
    auto* fs = s.add_fragments();
    fs->set_fragment(i);
    {
      std::lock_guard<std::mutex> lock(mu_);
      fs->set_round(f.round);
      fs->set_params_hash(f.params_hash);
      if (i == 0) s.set_tokens_committed(tokens_committed_);  // async: counts fragment 0's
      s.set_membership_epoch(membership_.epoch());
    }
    const OuterOptimizer& opt = f.data.optimizer();
    fs->set_num_elements(f.data.size());
    fs->set_optimizer(opt.name());
    ATL_RETURN_IF_ERROR(write(i, kParamsTensor, f.data.params().data(), f.data.size()));
    for (const auto& t : opt.StateTensors()) {
      auto* d = fs->add_optimizer_tensors();
      d->set_name(t.name);
      d->set_num_elements(t.values->size());
      d->set_hash(HashParams(*t.values));
      ATL_RETURN_IF_ERROR(write(i, t.name, t.values->data(), t.values->size()));
    }
    for (const auto& [name, value] : opt.StateCounters()) {
      auto* c = fs->add_optimizer_counters();
      c->set_name(name);
      c->set_value(value);
    }
  }
  s.set_written_unix_s(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  return s;
}

// Fragment i's parameters and outer optimizer from its state (the `index`-th of the description),
// every size checked against this service's (never what the file claims) and every tensor
// against its hash.
absl::StatusOr<std::pair<std::vector<float>, std::unique_ptr<OuterOptimizer>>>
SyncServer::ReadFragmentState(const pb::FragmentState& fs, uint32_t i, uint32_t index,
                              const StateRead& read) const {
  const size_t n = fragments_[i].layout.total();
  auto opt = MakeOuterOptimizer(options_.optimizer, n);
  if (!fs.optimizer().empty() && fs.optimizer() != opt->name()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "service state: fragment ", i, " was written by the ", Printable(fs.optimizer()),
        " outer optimizer, this run uses ", opt->name()));
  }
  auto read_tensor = [&](const std::string& name, uint64_t claimed, uint64_t hash)
      -> absl::StatusOr<std::vector<float>> {
    if (claimed != n) {
      return absl::DataLossError(absl::StrCat("service state: fragment ", i, " ",
                                              Printable(name), " has ", claimed,
                                              " elements, this run ", n));
    }
    std::vector<float> values(n);
    ATL_RETURN_IF_ERROR(read(index, name, values.data(), n));
    if (HashParams(values) != hash) {
      return absl::DataLossError(absl::StrCat("service state: fragment ", i, " ", Printable(name),
                                              " does not match its hash"));
    }
    return values;
  };
  ATL_ASSIGN_OR_RETURN(auto params, read_tensor(kParamsTensor, fs.num_elements(), fs.params_hash()));
  std::vector<std::pair<std::string, std::vector<float>>> tensors;
  for (const auto& t : fs.optimizer_tensors()) {
    ATL_ASSIGN_OR_RETURN(auto values, read_tensor(t.name(), t.num_elements(), t.hash()));
    tensors.emplace_back(t.name(), std::move(values));
  }
  std::vector<std::pair<std::string, int64_t>> counters;
  for (const auto& c : fs.optimizer_counters()) counters.emplace_back(c.name(), c.value());
  if (auto s = opt->Restore(std::move(tensors), counters); !s.ok()) {
    return absl::DataLossError(absl::StrCat("service state: fragment ", i, ": ", s.message()));
  }
  return std::make_pair(std::move(params), std::move(opt));
}

absl::Status SyncServer::Restore(const pb::ServiceState& state, const StateRead& read) {
  if (state.run_id() != options_.run_id) {
    return absl::FailedPreconditionError(absl::StrCat("service state is of run ",
                                                      Printable(state.run_id()), ", not '",
                                                      options_.run_id, "'"));
  }
  if (state.config_hash() != options_.config_hash) {
    return absl::FailedPreconditionError("service state was written for another model config");
  }
  // A shard's state holds its own fragments, in order.
  std::vector<uint32_t> owned;
  for (uint32_t i = 0; i < fragments_.size(); ++i) {
    if (ShardOwns(options_, i)) owned.push_back(i);
  }
  if (state.fragments_size() != int(owned.size())) {
    return absl::FailedPreconditionError(absl::StrCat("service state has ", state.fragments_size(),
                                                      " fragments, this ",
                                                      options_.num_shards > 1 ? "shard " : "run ",
                                                      owned.size()));
  }
  for (size_t j = 0; j < owned.size(); ++j) {
    if (state.fragments(int(j)).fragment() != owned[j]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "service state holds fragment ", state.fragments(int(j)).fragment(), " where this ",
          options_.num_shards > 1 ? "shard" : "run", " has fragment ", owned[j],
          " (another shard's state?)"));
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (membership_.size() > 0) {
      return absl::FailedPreconditionError("service state must be restored before islands join");
    }
  }
  // Check everything, then change anything: sizes against this service's (never what the file
  // claims), every tensor against its hash.
  std::vector<std::unique_ptr<OuterOptimizer>> optimizers;
  std::vector<std::vector<float>> params;
  for (size_t j = 0; j < owned.size(); ++j) {
    ATL_ASSIGN_OR_RETURN(auto restored, ReadFragmentState(state.fragments(int(j)), owned[j],
                                                          uint32_t(j), read));
    params.push_back(std::move(restored.first));
    optimizers.push_back(std::move(restored.second));
  }
  for (size_t j = 0; j < owned.size(); ++j) {
    Fragment& f = fragments_[owned[j]];
    std::lock_guard<std::mutex> data(*f.data_mu);
    f.data.Reset(std::move(params[j]), std::move(optimizers[j]));
    const double norm = f.data.Norm(pool_.get());
    std::lock_guard<std::mutex> lock(mu_);
    f.params_hash = state.fragments(int(j)).params_hash();
    f.params_norm = norm;
    f.round = state.fragments(int(j)).round();
    f.durable_round = f.round;
    f.committed.clear();
    f.contributions.clear();
    f.last_base.clear();
  }
  std::lock_guard<std::mutex> lock(mu_);
  tokens_committed_ = state.tokens_committed();
  // The round open at the resume is a first round again: it waits for the islands that come back
  // (each is waited for in it), for their full complement or, at most, a grace period.
  first_rounds_.clear();
  for (const auto& f : fragments_) first_rounds_.push_back(f.round);
  complement_reached_ = false;
  complement_deadline_ =
      absl::Now() + std::max(absl::Seconds(10), 2 * absl::Seconds(options_.lease_s));
  return absl::OkStatus();
}

void SyncServer::SetDurabilityGate(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  durability_gate_ = on;
}

void SyncServer::MarkDurable(const pb::ServiceState& written) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& fs : written.fragments()) {
    if (fs.fragment() < fragments_.size()) {
      Fragment& f = fragments_[fs.fragment()];
      f.durable_round = std::max(f.durable_round, fs.round());
    }
  }
  committed_cv_.notify_all();
}

}  // namespace atl::outer
