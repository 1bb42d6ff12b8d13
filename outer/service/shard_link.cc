#include "outer/service/shard_link.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "compression/status_macros.h"

namespace atl::outer {

absl::Status ShardLink::CheckShardCall(const pb::ShardSyncRequest& request) const {
  ATL_RETURN_IF_ERROR(core_.CheckRun(request.run_id()));
  if (!core_.is_control_plane()) {
    return absl::FailedPreconditionError(
        core_.is_shard()
            ? absl::StrCat("this is ", ShardName(core_.options), ", not the run's coordinator")
            : absl::StrCat("run '", core_.options.run_id,
                           "' is not sharded (outer.shards = 1 at its coordinator)"));
  }
  if (request.config_hash() != core_.options.config_hash) {
    return absl::FailedPreconditionError(
        absl::StrFormat("shard %d was started with another model config (hash %016x, the run's "
                        "%016x)",
                        request.shard(), request.config_hash(), core_.options.config_hash));
  }
  if (request.num_shards() != core_.options.num_shards) {
    return absl::FailedPreconditionError(absl::StrCat("a shard of ", request.num_shards(),
                                                      " called; the run has ",
                                                      core_.options.num_shards, " shards"));
  }
  const uint32_t k = request.shard();
  if (k >= core_.options.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", k, " of ", core_.options.num_shards, "?"));
  }
  if (request.address().empty() || request.address().size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", k, " gave no address (or a too long one)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<pb::ShardSyncResponse> ShardLink::ShardSync(const pb::ShardSyncRequest& request,
                                                           absl::Time deadline) {
  ATL_RETURN_IF_ERROR(CheckShardCall(request));
  const uint32_t k = request.shard();
  std::vector<uint32_t> owned;
  for (uint32_t f = k; f < core_.fragments.size(); f += core_.options.num_shards)
    owned.push_back(f);
  if (size_t(request.rounds_size()) != owned.size()) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", k, " reported ", request.rounds_size(),
                                                   " rounds for its ", owned.size(), " fragments"));
  }
  std::unique_lock<std::mutex> lock(core_.mu);
  if (core_.shard_addresses[k] != request.address() && core_.on_event) {
    core_.on_event(absl::StrCat("shard ", k, " of ", core_.options.num_shards, " serves fragments ",
                                absl::StrJoin(owned, ","), " at ", request.address()));
  }
  core_.shard_addresses[k] = request.address();
  for (size_t i = 0; i < owned.size(); ++i)
    core_.fragments[owned[i]].round = request.rounds(int(i));
  // A report made after an answer sent once every member had finished holds the final rounds.
  auto& end = core_.end_reports;
  end.fresh[k] = end.answered[k] > end.finished_at;
  const absl::Time now = absl::Now();
  for (const auto& island : request.heard())
    core_.membership.Contributed(island, now).IgnoreError();
  core_.membership_cv.wait_until(lock, absl::ToChronoTime(deadline), [&] {
    return core_.membership.epoch() != request.known_epoch() ||
           (end.finished_at != absl::InfiniteFuture() && !end.fresh[k]);
  });
  end.answered[k] = absl::Now();
  pb::ShardSyncResponse view;
  core_.membership.FillView(&view);
  view.set_complement_reached(core_.complement_reached);
  return view;
}

pb::ShardSyncRequest ShardLink::ShardReport(const std::string& address) {
  pb::ShardSyncRequest r;
  r.set_run_id(core_.options.run_id);
  r.set_shard(uint32_t(std::max(0, core_.options.shard)));
  r.set_num_shards(core_.options.num_shards);
  r.set_address(address);
  r.set_config_hash(core_.options.config_hash);
  std::lock_guard<std::mutex> lock(core_.mu);
  r.set_known_epoch(core_.membership.mirror() ? core_.membership.epoch() : 0);
  for (uint32_t f = 0; f < core_.fragments.size(); ++f) {
    if (ShardOwns(core_.options, f)) r.add_rounds(core_.fragments[f].round);
  }
  uint64_t committed = 0;
  for (const auto& f : core_.fragments) committed += f.round;
  r.set_committed_rounds(committed);
  for (auto& island : core_.membership.TakeHeard()) r.add_heard(std::move(island));
  return r;
}

void ShardLink::MirrorMembership(const pb::ShardSyncResponse& view) {
  std::vector<Rounds::CommitJob> jobs;
  {
    std::lock_guard<std::mutex> lock(core_.mu);
    std::vector<uint64_t> rounds;
    for (const auto& f : core_.fragments) rounds.push_back(f.round);
    for (const auto& name :
         core_.membership.Mirror(view, rounds, absl::Now(), core_.first_rounds)) {
      rounds_.ForgetLocked(name);
    }
    for (const auto& [name, m] : core_.membership.members()) {
      if (m.resume_floor < 0)
        core_.membership.FindMutable(name)->resume_floor = core_.ResumeFloorLocked();
    }
    core_.complement_reached = view.complement_reached();
    // Rounds may now be complete without the islands that left.
    jobs = rounds_.TakeReadyLocked(absl::Now());
  }
  rounds_.RunCommits(std::move(jobs));
}

}  // namespace atl::outer
