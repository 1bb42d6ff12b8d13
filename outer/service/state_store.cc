#include "outer/service/state_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "outer/base/names.h"
#include "outer/service/sync_server_internal.h"

namespace atl::outer {

using internal::TensorChecksum;

absl::StatusOr<pb::ServiceState> StateStore::Snapshot(const StateWrite& write) const {
  pb::ServiceState s;
  s.set_run_id(core_.options.run_id);
  s.set_config_hash(core_.options.config_hash);
  for (uint32_t i = 0; i < core_.fragments.size(); ++i) {
    if (!ShardOwns(core_.options, i)) continue;  // a sharded service: another shard's
    const ServiceFragment& f = core_.fragments[i];
    // The fragment's data as its last published commit left it; its next commit waits.
    std::lock_guard<std::mutex> data(*f.data_mu);
    auto* fs = s.add_fragments();
    fs->set_fragment(i);
    {
      std::lock_guard<std::mutex> lock(core_.mu);
      fs->set_round(f.round);
      fs->set_params_hash(f.params_hash);
      if (i == 0) s.set_tokens_committed(core_.tokens_committed);  // async: counts fragment 0's
      s.set_membership_epoch(core_.membership.epoch());
    }
    const OuterOptimizer& opt = f.data.optimizer();
    fs->set_num_elements(f.data.size());
    fs->set_optimizer(opt.name());
    ATL_RETURN_IF_ERROR(write(i, kParamsTensor, f.data.params().data(), f.data.size()));
    for (const auto& t : opt.StateTensors()) {
      auto* d = fs->add_optimizer_tensors();
      d->set_name(t.name);
      d->set_num_elements(t.values->size());
      d->set_hash(TensorChecksum(*t.values));
      ATL_RETURN_IF_ERROR(write(i, t.name, t.values->data(), t.values->size()));
    }
    for (const auto& [name, value] : opt.StateCounters()) {
      auto* c = fs->add_optimizer_counters();
      c->set_name(name);
      c->set_value(value);
    }
  }
  // The standings as of the writing: commits of fragments written earlier may have moved them.
  for (const SavedStanding& saved : core_.reputation.Save()) {
    auto* st = s.add_standings();
    st->set_island(saved.island);
    st->set_reputation(saved.reputation);
    st->set_judged(saved.judged);
    st->set_excluded_until(saved.excluded_until);
    st->set_loo_evidence(saved.loo_evidence);
  }
  {
    std::lock_guard<std::mutex> lock(core_.mu);
    core_.ledger.Save(s.mutable_ledger());
  }
  s.set_written_unix_s(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  return s;
}

absl::StatusOr<std::pair<std::vector<float>, std::unique_ptr<OuterOptimizer>>>
StateStore::ReadFragmentState(const pb::FragmentState& fs, uint32_t i, uint32_t index,
                              const StateRead& read) const {
  const size_t n = core_.fragments[i].layout.total();
  auto opt = MakeOuterOptimizer(core_.options.optimizer, n);
  if (!fs.optimizer().empty() && fs.optimizer() != opt->name()) {
    return absl::FailedPreconditionError(
        absl::StrCat("service state: fragment ", i, " was written by the ",
                     Printable(fs.optimizer()), " outer optimizer, this run uses ", opt->name()));
  }
  auto read_tensor = [&](const std::string& name, uint64_t claimed,
                         uint64_t hash) -> absl::StatusOr<std::vector<float>> {
    if (claimed != n) {
      return absl::DataLossError(absl::StrCat("service state: fragment ", i, " ", Printable(name),
                                              " has ", claimed, " elements, this run ", n));
    }
    std::vector<float> values(n);
    ATL_RETURN_IF_ERROR(read(index, name, values.data(), n));
    // The parameters carry the hash copies are compared by; the optimizer's tensors a checksum.
    const bool match = name == kParamsTensor ? compression::StoredParamsMatch(values.data(), n, hash)
                                             : TensorChecksum(values) == hash;
    if (!match) {
      return absl::DataLossError(absl::StrCat("service state: fragment ", i, " ", Printable(name),
                                              " does not match its hash"));
    }
    return values;
  };
  ATL_ASSIGN_OR_RETURN(auto params,
                       read_tensor(kParamsTensor, fs.num_elements(), fs.params_hash()));
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

absl::Status StateStore::CheckDescription(const pb::ServiceState& state,
                                          const std::vector<uint32_t>& owned) const {
  if (state.run_id() != core_.options.run_id) {
    return absl::FailedPreconditionError(absl::StrCat("service state is of run ",
                                                      Printable(state.run_id()), ", not '",
                                                      core_.options.run_id, "'"));
  }
  if (state.config_hash() != core_.options.config_hash) {
    return absl::FailedPreconditionError("service state was written for another model config");
  }
  if (state.fragments_size() != int(owned.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("service state has ", state.fragments_size(), " fragments, this ",
                     core_.options.num_shards > 1 ? "shard " : "run ", owned.size()));
  }
  for (size_t j = 0; j < owned.size(); ++j) {
    if (state.fragments(int(j)).fragment() != owned[j]) {
      return absl::FailedPreconditionError(
          absl::StrCat("service state holds fragment ", state.fragments(int(j)).fragment(),
                       " where this ", core_.options.num_shards > 1 ? "shard" : "run",
                       " has fragment ", owned[j], " (another shard's state?)"));
    }
  }
  return absl::OkStatus();
}

absl::Status StateStore::Restore(const pb::ServiceState& state, const StateRead& read) {
  // A shard's state holds its own fragments, in order.
  std::vector<uint32_t> owned;
  for (uint32_t i = 0; i < core_.fragments.size(); ++i) {
    if (ShardOwns(core_.options, i)) owned.push_back(i);
  }
  ATL_RETURN_IF_ERROR(CheckDescription(state, owned));
  {
    std::lock_guard<std::mutex> lock(core_.mu);
    if (core_.membership.size() > 0) {
      return absl::FailedPreconditionError("service state must be restored before islands join");
    }
  }
  // Check everything, then change anything: sizes against this service's (never what the file
  // claims), every tensor against its hash.
  std::vector<std::unique_ptr<OuterOptimizer>> optimizers;
  std::vector<std::vector<float>> params;
  for (size_t j = 0; j < owned.size(); ++j) {
    ATL_ASSIGN_OR_RETURN(auto restored,
                         ReadFragmentState(state.fragments(int(j)), owned[j], uint32_t(j), read));
    params.push_back(std::move(restored.first));
    optimizers.push_back(std::move(restored.second));
  }
  // The standings last: checked whole before they replace the service's, after which nothing
  // below can fail.
  std::vector<SavedStanding> standings;
  for (const auto& st : state.standings()) {
    standings.push_back(
        {st.island(), st.reputation(), st.judged(), st.excluded_until(), st.loo_evidence()});
  }
  TokenLedger ledger;
  ATL_RETURN_IF_ERROR(ledger.Restore(state.ledger()));
  ATL_RETURN_IF_ERROR(core_.reputation.Restore(standings));
  {
    std::lock_guard<std::mutex> lock(core_.mu);
    core_.ledger = std::move(ledger);
  }
  for (size_t j = 0; j < owned.size(); ++j) {
    ServiceFragment& f = core_.fragments[owned[j]];
    std::lock_guard<std::mutex> data(*f.data_mu);
    f.data.Reset(std::move(params[j]), std::move(optimizers[j]));
    const double norm = f.data.Norm();
    std::lock_guard<std::mutex> lock(core_.mu);
    f.params_hash = f.data.Hash();  // (a file written before ParamsHash stored another hash)
    f.params_norm = norm;
    f.round = state.fragments(int(j)).round();
    f.durable_round = f.round;
    f.committed.clear();
    f.contributions.clear();
    f.last_base.clear();
  }
  std::lock_guard<std::mutex> lock(core_.mu);
  core_.tokens_committed = state.tokens_committed();
  // The round open at the resume is a first round again: it waits for the islands that come back
  // (each is waited for in it), for their full complement or, at most, a grace period.
  core_.resumed = true;
  core_.first_rounds.clear();
  for (const auto& f : core_.fragments) core_.first_rounds.push_back(f.round);
  core_.complement_reached = false;
  core_.complement_deadline =
      absl::Now() + std::max(absl::Seconds(10), 2 * absl::Seconds(core_.options.lease_s));
  return absl::OkStatus();
}

void StateStore::SetDurabilityGate(bool on) {
  std::lock_guard<std::mutex> lock(core_.mu);
  core_.durability_gate = on;
}

void StateStore::MarkDurable(const pb::ServiceState& written) {
  std::lock_guard<std::mutex> lock(core_.mu);
  for (const auto& fs : written.fragments()) {
    if (fs.fragment() < core_.fragments.size()) {
      ServiceFragment& f = core_.fragments[fs.fragment()];
      f.durable_round = std::max(f.durable_round, fs.round());
    }
  }
  core_.committed_cv.notify_all();
}

absl::Status StateStore::FetchState(const pb::FetchStateRequest& request,
                                    const std::function<bool(pb::StateChunk&&)>& write) {
  ATL_RETURN_IF_ERROR(core_.CheckRun(request.run_id()));
  ATL_ASSIGN_OR_RETURN(auto fid, core_.CheckFragment(request.fragment()));
  const ServiceFragment& f = core_.fragments[fid];
  const compression::CodecSpec fp32{compression::Codec::kFp32, 0};
  uint64_t round, hash, range_hash, total, n;
  {
    std::lock_guard<std::mutex> data(*f.data_mu);  // the parameters of a published round
    std::lock_guard<std::mutex> lock(core_.mu);
    ATL_RETURN_IF_ERROR(core_.membership.Authenticate(request.island_id(), request.session()));
    total = f.data.params().size();
    ATL_RETURN_IF_ERROR(CheckRange(request.offset(), request.num_elements(), total, fid));
    n = request.num_elements() == 0 ? total - request.offset() : request.num_elements();
    round = f.round;
    hash = f.params_hash;
    range_hash = f.data.RangeHash(request.offset(), request.offset() + n);
  }
  const ChunkPlan plan = PlanChunks(fp32, n, core_.options.chunk_bytes);
  for (uint32_t c = 0; c < plan.num_chunks; ++c) {
    const uint64_t first = uint64_t(c) * plan.per_chunk;
    const uint64_t count = std::min(plan.per_chunk, n - first);
    pb::StateChunk out;
    {
      std::lock_guard<std::mutex> data(*f.data_mu);
      uint64_t now;
      {
        std::lock_guard<std::mutex> lock(core_.mu);
        now = f.round;
        // The island reads what it asked for (flow control stops these writes otherwise): it is
        // alive, though its heartbeats may wait behind this stream on a slow link.
        core_.membership.Heartbeat(request.island_id(), absl::Now()).IgnoreError();
      }
      if (now != round) {
        return absl::AbortedError(absl::StrCat("fragment ", fid, " committed round ", now,
                                               " while its state was sent; fetch it again"));
      }
      ATL_ASSIGN_OR_RETURN(auto chunk,
                           EncodeChunk({core_.options.run_id, "", round, fid}, fp32,
                                       f.data.params().data() + request.offset() + first,
                                       request.offset() + first, count, total, c, plan.num_chunks));
      *out.mutable_chunk() = std::move(chunk);
    }
    out.set_params_hash(hash);
    out.set_range_hash(range_hash);
    if (!write(std::move(out))) return absl::CancelledError("the caller went away");
  }
  return absl::OkStatus();
}

}  // namespace atl::outer
