#include "outer/island/island_sync.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "compression/checksum.h"
#include "compression/codec_math.h"
#include "compression/status_macros.h"
#include "outer/base/outer_optimizer.h"
#include "outer/island/island_sync_internal.h"

namespace atl::outer {

using internal::FirstError;
using internal::RunLanes;
using internal::Since;

IslandSync::IslandSync(Transport* transport, std::string run_id,
                       std::shared_ptr<const IslandIdentity> identity, uint64_t fragment_elements,
                       IslandSyncOptions options)
    : transport_(transport),
      run_id_(std::move(run_id)),
      island_id_(identity->island_id()),
      identity_(std::move(identity)),
      fragment_elements_(fragment_elements),
      ranges_(!options.carried ? std::vector<std::pair<uint64_t, uint64_t>>{}
              : options.ranges.empty()
                  ? std::vector<std::pair<uint64_t, uint64_t>>{{0, fragment_elements}}
                  : options.ranges),
      options_(options) {
  n_ = 0;
  for (const auto& [b, e] : ranges_) n_ += e - b;
  residual_.assign(options.error_feedback ? n_ : 0, 0.0f);
  next_residual_.assign(residual_.size(), 0.0f);
  global_.assign(n_, 0.0f);
}

std::vector<float> IslandSync::ResidualSnapshot() const {
  if (options_.error_feedback && device_) return device_->ResidualSnapshot();
  std::lock_guard<std::mutex> lock(residual_mu_);
  return residual_;
}

absl::Status IslandSync::RestoreResidual(std::vector<float> residual) {
  if (!options_.error_feedback) {
    return absl::FailedPreconditionError("this fragment keeps no residual (no error feedback)");
  }
  if (residual.size() != n_) {
    return absl::InvalidArgumentError(absl::StrCat("a residual of ", residual.size(),
                                                   " elements for ", n_, " owned"));
  }
  if (device_) return device_->RestoreResidual(residual);
  std::lock_guard<std::mutex> lock(residual_mu_);
  residual_ = std::move(residual);
  return absl::OkStatus();
}

uint64_t IslandSync::global_hash() const {
  return compression::ParamsHash(global_.data(), 0, global_.size());
}

// What the pieces of one state transfer agree on, shared by its lanes.
struct IslandSync::FetchProgress {
  std::mutex mu;
  uint64_t round = UINT64_MAX, hash = 0, bytes = 0;
  bool changed = false;
};

absl::Status IslandSync::FetchPiece(uint64_t offset, uint64_t count, float* out, int lane,
                                    FetchProgress& progress) {
  pb::FetchStateRequest request;
  request.set_run_id(run_id_);
  request.set_island_id(island_id_);
  request.set_session(identity_->session());
  request.set_fragment(options_.fragment);
  request.set_offset(offset);
  request.set_num_elements(count);
  for (int tries = 0;; ++tries) {
    // The piece lands in `out` chunk by chunk; it is checked whole against its hash at the end.
    std::optional<Assembler> assembler;
    uint64_t round = 0, hash = 0, range_hash = 0, bytes = 0;
    absl::Status s = transport_->FetchState(
        request,
        [&](pb::StateChunk&& c) -> absl::Status {
          if (!assembler) {
            const auto& h0 = c.chunk().header();
            round = h0.round();
            hash = c.params_hash();
            range_hash = c.range_hash();
            assembler.emplace(PayloadId{run_id_, h0.island_id(), round, options_.fragment},
                              fragment_elements_, offset, count,
                              compression::CodecSpec{compression::Codec::kFp32, 0},
                              [&](uint64_t first, const float* v, uint64_t k) {
                                std::copy(v, v + k, out + (first - offset));
                              });
          } else if (c.params_hash() != hash || c.range_hash() != range_hash) {
            return absl::DataLossError("state chunks disagree on the parameters' hash");
          }
          bytes += c.ByteSizeLong();
          return assembler->Add(c.chunk());
        },
        lane);
    if (absl::IsAborted(s)) {
      std::lock_guard<std::mutex> lock(progress.mu);
      progress.changed = true;  // a round committed while the piece was sent: start over
      return absl::OkStatus();
    }
    if (s.ok() && !assembler) s = absl::DataLossError("the service sent no state");
    if (s.ok()) s = assembler->CheckComplete();
    if (s.ok() && compression::ParamsHash(out, offset, count) != range_hash) {
      s = absl::DataLossError("fetched state does not match its hash");
    }
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(progress.mu);
      if (progress.round != UINT64_MAX && (round != progress.round || hash != progress.hash)) {
        progress.changed = true;  // a round committed in between: start over
      }
      progress.round = round;
      progress.hash = hash;
      progress.bytes += bytes;
      return absl::OkStatus();
    }
    if (!internal::Transient(s) || tries >= options_.retries) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50 << (tries + 1), 2000)));
  }
}

absl::Status IslandSync::Adopt(std::vector<float> values, uint64_t round, uint64_t hash) {
  if (!carried() || !whole() || values.size() != n_ || hash == 0 ||
      compression::ParamsHash(values.data(), 0, n_) != hash) {
    return absl::FailedPreconditionError("the island's parameters are not the service's");
  }
  global_ = std::move(values);
  round_ = round;
  return device_ ? device_->Load(global_) : absl::OkStatus();
}

absl::Status IslandSync::FetchGlobal() {
  if (!carried()) return absl::OkStatus();
  absl::Status last = absl::OkStatus();
  const uint64_t piece = std::max<uint64_t>(1, options_.fetch_piece_bytes / sizeof(float));
  // The owned ranges in pieces, each its own request: a cut transfer resumes at its piece.
  std::vector<Span> pieces;
  for (uint64_t at = 0, r = 0; r < ranges_.size(); ++r) {
    for (uint64_t b = ranges_[r].first; b < ranges_[r].second; b += piece) {
      pieces.push_back({at + (b - ranges_[r].first), b, std::min(b + piece, ranges_[r].second)});
    }
    at += ranges_[r].second - ranges_[r].first;
  }
  const int n_lanes = int(std::min<size_t>(size_t(lanes()), pieces.size()));
  for (int attempt = 0; attempt <= options_.retries; ++attempt) {
    std::vector<float> values(n_);
    FetchProgress progress;
    std::vector<absl::Status> statuses(size_t(std::max(1, n_lanes)));
    RunLanes(n_lanes, [&](int lane) {
      for (size_t i = size_t(lane); i < pieces.size(); i += size_t(n_lanes)) {
        {
          std::lock_guard<std::mutex> lock(progress.mu);
          if (progress.changed) return;
        }
        const Span& p = pieces[i];
        statuses[size_t(lane)] = FetchPiece(p.begin, p.end - p.begin, values.data() + p.at, lane,
                                            progress);
        if (!statuses[size_t(lane)].ok()) return;
      }
    });
    ATL_RETURN_IF_ERROR(FirstError(statuses));
    if (progress.changed) continue;
    if (whole() && compression::ParamsHash(values.data(), 0, n_) != progress.hash) {
      last = absl::DataLossError("fetched state does not match its hash");
      continue;
    }
    global_ = std::move(values);
    round_ = progress.round;
    fetched_bytes_ += progress.bytes;
    return device_ ? device_->Load(global_) : absl::OkStatus();
  }
  return last.ok() ? absl::AbortedError("the global state kept changing during the transfer") : last;
}

absl::StatusOr<RoundOutcome> IslandSync::SyncRound(const std::vector<float>& local,
                                                   uint64_t tokens, double steps_per_s,
                                                   uint64_t step) {
  if (device_) {
    return absl::FailedPreconditionError("this fragment's pseudo-gradient is made on the device");
  }
  if (local.size() != n_) {
    return absl::InvalidArgumentError(
        absl::StrCat("local parameters have ", local.size(), " elements, expected ", n_));
  }
  return Round(&local, tokens, steps_per_s, step);
}

absl::StatusOr<RoundOutcome> IslandSync::SyncRoundOnDevice(uint64_t tokens, double steps_per_s,
                                                           uint64_t step) {
  if (!device_ && carried()) {
    return absl::FailedPreconditionError("this fragment has no device copy");
  }
  return Round(nullptr, tokens, steps_per_s, step);
}

absl::StatusOr<pb::PushResponse> IslandSync::Contribute(const std::vector<float>& local,
                                                        uint64_t tokens, uint64_t step) {
  if (options_.async || device_ || !carried()) {
    return absl::FailedPreconditionError("only a sync fragment held on the host contributes alone");
  }
  if (local.size() != n_) {
    return absl::InvalidArgumentError(
        absl::StrCat("local parameters have ", local.size(), " elements, expected ", n_));
  }
  RoundOutcome out;
  return PushContribution(&local, tokens, 0, step, out);
}

void IslandSync::set_device_copy(DeviceCopy* copy) { device_ = copy && carried() ? copy : nullptr; }

absl::StatusOr<RoundOutcome> IslandSync::Round(const std::vector<float>* local, uint64_t tokens,
                                               double steps_per_s, uint64_t step) {
  RoundOutcome out;
  out.round = round_;
  out.elements = n_;
  if (!carried()) {
    round_ += 1;
    out.version = round_;
    return out;
  }
  auto resync = [&](std::string reason) -> absl::StatusOr<RoundOutcome> {
    {
      std::lock_guard<std::mutex> lock(residual_mu_);
      std::fill(residual_.begin(), residual_.end(), 0.0f);
    }
    if (device_) device_->ResetResidual();
    ATL_RETURN_IF_ERROR(FetchGlobal());
    out.resynced = true;
    out.resync_reason = std::move(reason);
    out.version = round_;
    return out;
  };

  for (int attempt = 0;; ++attempt) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<pb::PushResponse> pushed =
        PushContribution(local, tokens, steps_per_s, step, out);
    out.push_s += Since(t0);
    const bool recorded = !options_.async && absl::IsAlreadyExists(pushed.status());
    if (!pushed.ok() && !recorded) {
      // Stale or unknown round; or (async) a retried push that had been applied after all, whose
      // version this island does not know: the full state puts it right.
      if (absl::IsFailedPrecondition(pushed.status()) ||
          (options_.async && absl::IsAlreadyExists(pushed.status()))) {
        if (local != nullptr && !options_.async) out.refused_from = global_;
        return resync(std::string(pushed.status().message()));
      }
      return pushed.status();
    }
    if (recorded) {
      // Sync: this island's contribution to the round is there already (a push pushed again after
      // its answer was lost): the round's update is what comes next, as for any push.
      pushed = pb::PushResponse();
    }
    const auto t1 = std::chrono::steady_clock::now();
    const uint64_t until = TakeAnswer(*pushed, out);
    absl::Status applied = absl::OkStatus();
    while (round_ < until && applied.ok()) applied = ApplyRound(round_, out);
    out.wait_s += Since(t1);
    if (applied.ok()) break;
    if (absl::IsAborted(applied) && round_ == out.round && local != nullptr &&
        attempt < options_.retries) {
      // The service lost the push (it resumed from its durable state before the round was
      // durable) and the round may wait for it: the same contribution again, from the residual
      // it was made with.
      std::lock_guard<std::mutex> lock(residual_mu_);
      if (options_.error_feedback) residual_.swap(next_residual_);
      out.pushed_again += 1;
      continue;
    }
    if (absl::IsDataLoss(applied)) {
      // Never expected: the same fp32 subtraction on the same inputs. Recover with the state.
      std::fprintf(stderr, "atoll: error: island '%s': %s; fetching the full state\n",
                   island_id_.c_str(), std::string(applied.message()).c_str());
    }
    if (absl::IsFailedPrecondition(applied) || absl::IsDataLoss(applied) ||
        absl::IsAborted(applied)) {
      return resync(std::string(applied.message()));
    }
    return applied;
  }
  out.version = round_;
  return out;
}

uint64_t IslandSync::TakeAnswer(const pb::PushResponse& pushed, RoundOutcome& out) const {
  out.contributors = pushed.contributors();
  if (pushed.tau_set()) out.tau = int(pushed.tau());
  if (!options_.async && pushed.late()) {
    out.late = true;
    out.staleness = pushed.staleness();
    out.behind_s = pushed.behind_s();
  }
  // The run's tokens (async; sync runs that end at their tokens).
  out.tokens_committed = pushed.tokens_committed();
  out.budget_reached = pushed.budget_reached();
  out.sync_every = pushed.sync_every();  // async; sync ending at its tokens (DyLU)
  if (options_.async) out.staleness = pushed.staleness();
  // Sync: the round's update; after a late push, every round committed since (the island goes on
  // from the open one). Async: every version since the one this contribution started from, its
  // own included.
  return options_.async || out.late ? std::max(pushed.version(), round_ + 1) : round_ + 1;
}

absl::StatusOr<RoundOutcome> IslandSync::CatchUp(uint64_t version) {
  RoundOutcome out;
  out.round = round_;
  if (!carried()) {
    round_ = version;
    out.version = round_;
    return out;
  }
  while (round_ < version) {
    if (auto s = ApplyRound(round_, out); !s.ok()) {
      if (!absl::IsFailedPrecondition(s) && !absl::IsDataLoss(s)) return s;
      ATL_RETURN_IF_ERROR(FetchGlobal());
      out.resynced = true;
      out.resync_reason = std::string(s.message());
    }
  }
  out.version = round_;
  return out;
}

}  // namespace atl::outer
