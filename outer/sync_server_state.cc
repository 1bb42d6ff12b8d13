// The durable state of the service: snapshots for the writer, restoring one (all or nothing),
// and the gate that releases a round only once it is durable.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/checksum.h"
#include "compression/status_macros.h"
#include "outer/aggregation.h"
#include "outer/names.h"
#include "outer/sync_server.h"
#include "outer/sync_server_internal.h"

namespace atl::outer {

using internal::HashParams;

const char* SyncServer::StateTensorName(StateTensor t) {
  switch (t) {
    case StateTensor::kParams: return "parameters";
    case StateTensor::kMomentum: return "momentum";
    case StateTensor::kBuffer: return "momentum buffer";
  }
  return "tensor";
}

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
    fs->set_momentum_elements(opt.momentum().size());
    fs->set_buffer_elements(opt.buffer().size());
    fs->set_momentum_hash(HashParams(opt.momentum()));
    fs->set_buffer_hash(HashParams(opt.buffer()));
    fs->set_buffered(uint32_t(opt.buffered()));
    const std::pair<StateTensor, const std::vector<float>*> tensors[] = {
        {StateTensor::kParams, &f.data.params()},
        {StateTensor::kMomentum, &opt.momentum()},
        {StateTensor::kBuffer, &opt.buffer()}};
    for (const auto& [tensor, values] : tensors) {
      ATL_RETURN_IF_ERROR(write(i, tensor, values->data(), values->size()));
    }
  }
  s.set_written_unix_s(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  return s;
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
  std::vector<OuterOptimizer> optimizers;
  std::vector<std::vector<float>> params;
  for (size_t j = 0; j < owned.size(); ++j) {
    const uint32_t i = owned[j];
    const auto& fs = state.fragments(int(j));
    const size_t n = fragments_[i].layout.total();
    OuterOptimizer opt(options_.optimizer, n);
    const std::pair<StateTensor, std::pair<uint64_t, uint64_t>> expected[] = {
        {StateTensor::kParams, {fs.num_elements(), fs.params_hash()}},
        {StateTensor::kMomentum, {fs.momentum_elements(), fs.momentum_hash()}},
        {StateTensor::kBuffer, {fs.buffer_elements(), fs.buffer_hash()}}};
    std::vector<float> tensors[3];
    const size_t sizes[3] = {n, opt.momentum().size(), opt.buffer().size()};
    for (int t = 0; t < 3; ++t) {
      const auto& [tensor, claimed] = expected[t];
      if (claimed.first != sizes[t]) {
        return absl::DataLossError(absl::StrCat("service state: fragment ", i, " ",
                                                StateTensorName(tensor), " has ", claimed.first,
                                                " elements, this run ", sizes[t]));
      }
      tensors[t].resize(sizes[t]);
      ATL_RETURN_IF_ERROR(read(uint32_t(j), tensor, tensors[t].data(), sizes[t]));
      if (HashParams(tensors[t]) != claimed.second) {
        return absl::DataLossError(absl::StrCat("service state: fragment ", i, " ",
                                                StateTensorName(tensor),
                                                " do not match their hash"));
      }
    }
    if (auto s = opt.Restore(std::move(tensors[1]), std::move(tensors[2]), int(fs.buffered()));
        !s.ok()) {
      return absl::DataLossError(absl::StrCat("service state: fragment ", i, ": ", s.message()));
    }
    optimizers.push_back(std::move(opt));
    params.push_back(std::move(tensors[0]));
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
