// OuterStepHook's rejoins and its leaving (outer/island/outer_step.h): how an island that was
// dropped, cut off or stopped keeps what it trained.
//
// An island that comes back (its lease ran out while it was paused or cut off, or the service
// restarted) has trained steps the service has not seen: a push that did not get through, and the
// steps since its last push. None of them is thrown away:
// - a push that did not get through is pushed again: on time when its round is still open, else
//   late (the service folds it into the open round, outer.max_staleness, outer/service/rounds.h);
// - the global copy catches up with the rounds committed meanwhile (their updates, each checked by
//   its hash), and the island's progress since its last push is carried onto it: the model holds
//   global + (local - base), where base is what that progress was trained from. Its next push
//   carries those steps and claims their tokens, on time;
// - the schedule puts the island at the start of the run's open rounds (outer/island/
//   round_policy.cc): it owes the steps it was away for and trains them at the end.
// Where that cannot be done (async mode, a device copy, eager stand-ins, a service that went back
// to an older state, ranks that disagree), the refused pushes are pushed again late and the island
// goes on from the global state.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/status_macros.h"
#include "outer/island/outer_step.h"

namespace atl::outer {

absl::Status OuterStepHook::Rejoin(const absl::Status& why) {
  if (on_message) on_message(absl::StrCat("rejoining the run: ", why.message()));
  ATL_RETURN_IF_ERROR(session_.Rejoin(ranks_));
  if (session_.joined().data_stream() != session_.data_stream() && on_message) {
    on_message(absl::StrCat("warning: its data stream ", session_.data_stream(),
                            " was taken meanwhile (the service assigned ",
                            session_.joined().data_stream(), "); this island goes on reading stream ",
                            session_.data_stream()));
  }
  std::vector<uint64_t> service;
  for (const auto& f : session_.joined().fragments()) service.push_back(f.round());
  ATL_ASSIGN_OR_RETURN(const bool keep, CanKeepProgress(service));
  bool ahead = false;
  if (keep) {
    ATL_RETURN_IF_ERROR(KeepProgress(service));
  } else {
    for (uint32_t f = 0; f < syncs_.size() && f < service.size(); ++f) {
      ahead |= syncs_[f]->round() > service[f];
    }
    // Every rank takes the same step back (or none) whatever rounds it held itself.
    ATL_ASSIGN_OR_RETURN(ahead, ranks_.Any(ahead));
    PushRefusedAgain();
    ATL_RETURN_IF_ERROR(LoadGlobal());
  }
  pending_rejoin_.reset();
  stats_.rejoins += 1;
  // Every rank continues at the same rounds (LoadGlobal and KeepProgress have them agree).
  policy_->Rejoined(Where(ahead), model_);
  if (!keep) std::fill(last_push_.begin(), last_push_.end(), model_.step());
  if (on_message) {
    on_message(absl::StrCat("rejoined at round ", syncs_[0]->round(),
                            keep ? ", keeping its progress" : ", from the global state"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> OuterStepHook::CanKeepProgress(const std::vector<uint64_t>& service) {
  bool can = !options_.schedule.async && eager_.empty() && service.size() == syncs_.size();
  // What this rank holds: each fragment's round and whether a refused push of it waits.
  std::string mine;
  for (uint32_t f = 0; f < syncs_.size() && can; ++f) {
    can = model_.device_copy(f) == nullptr && syncs_[f]->round() <= service[f];
    const bool refused = std::any_of(refused_.begin(), refused_.end(),
                                     [&](const InFlight& j) { return j.fragment == f; });
    absl::StrAppend(&mine, syncs_[f]->round(), refused ? "r " : " ");
  }
  ATL_ASSIGN_OR_RETURN(auto first, ranks_.FromFirst(mine));
  ATL_ASSIGN_OR_RETURN(auto apart, ranks_.Any(!can || mine != first));
  return !apart;
}

absl::Status OuterStepHook::KeepProgress(const std::vector<uint64_t>& service) {
  std::vector<InFlight> refused = std::move(refused_);
  refused_.clear();
  for (uint32_t f = 0; f < syncs_.size(); ++f) {
    IslandSync& sync = *syncs_[f];
    auto it = std::find_if(refused.begin(), refused.end(),
                           [&](const InFlight& j) { return j.fragment == f; });
    if (it != refused.end() && sync.round() == service[f]) {
      // Its round is still open: the push goes again as it went, and lands when it was due.
      InFlight job = std::move(*it);
      job.result = std::async(std::launch::async, [sync = &sync, local = job.local,
                                                   tokens = job.tokens, rate = job.steps_per_s,
                                                   at = job.pushed_at] {
        return sync->SyncRound(*local, tokens, rate, uint64_t(at));
      });
      bytes_in_flight_ += job.bytes;
      in_flight_.push_back(std::move(job));
      continue;
    }
    if (it == refused.end() && sync.round() == service[f]) continue;  // the island's round is open
    // Its round committed without the island. What the island trained since its last push was
    // trained from `base`: the refused push's parameters, or the global copy of that round.
    std::vector<float> base;
    if (it != refused.end()) {
      auto again = sync.SyncRound(*it->local, it->tokens, it->steps_per_s, uint64_t(it->pushed_at));
      if (again.ok()) {
        stats_.bytes_sent += again->bytes_sent;
        stats_.bytes_received += again->bytes_received;
        stats_.late_pushes += again->late ? 1 : 0;
      }
      // Refused again, its round too old: its steps are carried with the island's progress.
      const bool carried = again.ok() && !again->refused_from.empty();
      if (on_message) {
        on_message(again.ok() && !again->resynced
                       ? absl::StrCat("fragment ", f, ": its push refused while away reached the "
                                      "model", again->late ? absl::StrCat(" late (", again->staleness,
                                                                           " round(s) stale)")
                                                          : "")
                   : carried
                       ? absl::StrCat("fragment ", f, ": its push refused while away (",
                                      again->resync_reason, ") goes with its next push")
                       : absl::StrCat("fragment ", f, ": its push refused while away is lost: ",
                                      again.ok() ? again->resync_reason : again.status().message()));
      }
      base = carried ? std::move(again->refused_from) : *it->local;
      if (carried) last_push_[f] = it->since;
    } else {
      base = sync.global();
    }
    auto caught = Retry(options_.island.retry, [&] { return sync.CatchUp(service[f]); });
    if (!caught.ok()) return caught.status();
    stats_.bytes_received += caught->bytes_received;
    stats_.resyncs += caught->resynced ? 1 : 0;
    ATL_RETURN_IF_ERROR(AgreeOnRound(f));
    std::vector<float> local = model_.Snapshot(f);
    const std::vector<float>& global = sync.global();
    if (local.size() != global.size() || base.size() != global.size()) {
      model_.Merge(f, global, 0.0);  // a rank that holds none of it
      continue;
    }
    for (size_t i = 0; i < local.size(); ++i) local[i] = global[i] + (local[i] - base[i]);
    model_.Merge(f, local, 0.0);
  }
  return absl::OkStatus();
}

void OuterStepHook::PushRefusedAgain() {
  for (InFlight& job : refused_) {
    // The island's copy is still at the round it was pushed for: the same contribution, with the
    // new session, on time if that round is open, else folded into the open round if it is at most
    // outer.max_staleness rounds late.
    auto again = syncs_[job.fragment]->SyncRound(*job.local, job.tokens, job.steps_per_s,
                                                 uint64_t(job.pushed_at));
    if (on_message) {
      on_message(again.ok() && !again->resynced
                     ? absl::StrCat("fragment ", job.fragment,
                                    ": its push refused while away reached the model",
                                    again->late ? " late" : "")
                     : absl::StrCat("fragment ", job.fragment, ": its push refused while away is lost: ",
                                    again.ok() ? again->resync_reason : again.status().message()));
    }
    if (again.ok()) {
      stats_.bytes_sent += again->bytes_sent;
      stats_.bytes_received += again->bytes_received;
      if (again->late) stats_.late_pushes += 1;
    }
  }
  refused_.clear();
}

absl::Status OuterStepHook::LeaveWithProgress() {
  ATL_RETURN_IF_ERROR(LandAll(/*keep_local=*/true));
  refused_.clear();
  if (options_.schedule.async) return absl::OkStatus();
  const int64_t t = model_.step();
  for (uint32_t f = 0; f < syncs_.size(); ++f) {
    IslandSync& sync = *syncs_[f];
    if (t <= last_push_[f] || !sync.carried() || model_.device_copy(f) != nullptr) continue;
    auto pushed = sync.Contribute(model_.Snapshot(f), TokensSincePush(f, t), uint64_t(t));
    if (on_message && ranks_.rank() == 0) {
      on_message(pushed.ok()
                     ? absl::StrFormat("leaving: the last %d step(s) of fragment %d pushed to its "
                                       "round %d%s",
                                       t - last_push_[f], f, sync.round(),
                                       pushed->late() ? " (late)" : "")
                     : absl::StrCat("leaving: the last steps of fragment ", f,
                                    " were not taken: ", pushed.status().message()));
    }
    if (pushed.ok()) last_push_[f] = t;
  }
  return absl::OkStatus();
}

}  // namespace atl::outer
