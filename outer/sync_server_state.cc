// The durable state of the service: snapshots for the writer, restoring one (all or nothing),
// and the gate that releases a round only once it is durable.
#include "outer/sync_server.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/checksum.h"
#include "outer/aggregation.h"
#include "outer/names.h"
#include "outer/sync_server_internal.h"

namespace atl::outer {

using internal::HashParams;
using internal::Norm;
using internal::kCommittedKept;

namespace {


std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

absl::StatusOr<std::vector<float>> FloatsOf(const std::string& bytes, size_t expected,
                                            const char* what, uint32_t fragment) {
  if (bytes.size() != expected * sizeof(float)) {
    return absl::DataLossError(absl::StrCat("service state: fragment ", fragment, " ", what, " has ",
                                            bytes.size(), " bytes, expected ",
                                            expected * sizeof(float)));
  }
  std::vector<float> v(expected);
  if (!bytes.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

}  // namespace

pb::ServiceState SyncServer::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  pb::ServiceState s;
  s.set_run_id(options_.run_id);
  s.set_config_hash(options_.config_hash);
  s.set_membership_epoch(membership_.epoch());
  s.set_tokens_committed(tokens_committed_);
  for (uint32_t i = 0; i < fragments_.size(); ++i) {
    const Fragment& f = fragments_[i];
    auto* fs = s.add_fragments();
    fs->set_fragment(i);
    fs->set_round(f.round);
    fs->set_params_hash(f.params_hash);
    fs->set_num_elements(f.params.size());
    fs->set_params(FloatBytes(f.params));
    fs->set_momentum(FloatBytes(f.optimizer.momentum()));
    fs->set_momentum_buffer(FloatBytes(f.optimizer.buffer()));
    fs->set_buffered(uint32_t(f.optimizer.buffered()));
  }
  s.set_written_unix_s(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  return s;
}

absl::Status SyncServer::Restore(const pb::ServiceState& state) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state.run_id() != options_.run_id) {
    return absl::FailedPreconditionError(absl::StrCat("service state is of run '", state.run_id(),
                                                      "', not '", options_.run_id, "'"));
  }
  if (state.config_hash() != options_.config_hash) {
    return absl::FailedPreconditionError("service state was written for another model config");
  }
  if (state.fragments_size() != int(fragments_.size())) {
    return absl::FailedPreconditionError(absl::StrCat("service state has ", state.fragments_size(),
                                                      " fragments, this run ", fragments_.size()));
  }
  if (membership_.size() > 0) {
    return absl::FailedPreconditionError("service state must be restored before islands join");
  }
  // Check everything, then change anything.
  std::vector<OuterOptimizer> optimizers;
  std::vector<std::vector<float>> params;
  for (uint32_t i = 0; i < fragments_.size(); ++i) {
    const auto& fs = state.fragments(int(i));
    const size_t n = fragments_[i].params.size();
    auto p = FloatsOf(fs.params(), n, "parameters", i);
    if (!p.ok()) return p.status();
    if (HashParams(*p) != fs.params_hash()) {
      return absl::DataLossError(absl::StrCat("service state: fragment ", i,
                                              " parameters do not match their hash"));
    }
    OuterOptimizer opt(options_.optimizer, n);
    auto m = FloatsOf(fs.momentum(), opt.momentum().size(), "momentum", i);
    if (!m.ok()) return m.status();
    auto b = FloatsOf(fs.momentum_buffer(), opt.buffer().size(), "momentum buffer", i);
    if (!b.ok()) return b.status();
    if (auto s = opt.Restore(*std::move(m), *std::move(b), int(fs.buffered())); !s.ok()) {
      return absl::DataLossError(absl::StrCat("service state: fragment ", i, ": ", s.message()));
    }
    optimizers.push_back(std::move(opt));
    params.push_back(*std::move(p));
  }
  for (uint32_t i = 0; i < fragments_.size(); ++i) {
    Fragment& f = fragments_[i];
    f.params = std::move(params[i]);
    f.params_hash = state.fragments(int(i)).params_hash();
    f.params_norm = Norm(f.params);
    f.optimizer = std::move(optimizers[i]);
    f.round = state.fragments(int(i)).round();
    f.durable_round = f.round;
    f.committed.clear();
    f.contributions.clear();
    f.last_base.clear();
  }
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
