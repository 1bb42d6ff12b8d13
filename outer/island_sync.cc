#include "outer/island_sync.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "compression/checksum.h"
#include "compression/codec_math.h"
#include "outer/outer_optimizer.h"

namespace atl::outer {
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

IslandSync::IslandSync(Transport* transport, std::string run_id, std::string island_id,
                       uint64_t fragment_elements, IslandSyncOptions options)
    : transport_(transport),
      run_id_(std::move(run_id)),
      island_id_(std::move(island_id)),
      n_(fragment_elements),
      options_(options),
      residual_(options.error_feedback ? fragment_elements : 0, 0.0f),
      global_(fragment_elements, 0.0f) {}

uint64_t IslandSync::global_hash() const {
  return compression::Checksum(global_.data(), global_.size() * sizeof(float));
}

absl::Status IslandSync::FetchGlobal() {
  pb::FetchStateRequest request;
  request.set_run_id(run_id_);
  request.set_island_id(island_id_);
  request.set_fragment(options_.fragment);
  auto chunks = transport_->FetchState(request);
  if (!chunks.ok()) return chunks.status();
  if (chunks->empty()) return absl::DataLossError("the service sent no state");
  const auto& h0 = chunks->front().chunk().header();
  Assembler assembler({run_id_, h0.island_id(), h0.round(), options_.fragment}, n_, 0, n_);
  for (const auto& c : *chunks) {
    if (c.params_hash() != chunks->front().params_hash()) {
      return absl::DataLossError("state chunks disagree on the parameters' hash");
    }
    if (auto s = assembler.Add(c.chunk()); !s.ok()) return s;
  }
  if (auto s = assembler.CheckComplete(); !s.ok()) return s;
  const uint64_t hash = compression::Checksum(assembler.values().data(), n_ * sizeof(float));
  if (hash != chunks->front().params_hash()) {
    return absl::DataLossError("fetched state does not match its hash");
  }
  global_ = std::move(assembler.mutable_values());
  round_ = h0.round();
  fetched_bytes_ += WireBytes(*chunks);
  return absl::OkStatus();
}

absl::StatusOr<RoundOutcome> IslandSync::SyncRound(const std::vector<float>& local,
                                                   uint64_t tokens, double steps_per_s) {
  if (local.size() != n_) {
    return absl::InvalidArgumentError(
        absl::StrCat("local parameters have ", local.size(), " elements, expected ", n_));
  }
  RoundOutcome out;
  out.round = round_;
  auto resync = [&](std::string reason) -> absl::StatusOr<RoundOutcome> {
    std::fill(residual_.begin(), residual_.end(), 0.0f);
    if (auto s = FetchGlobal(); !s.ok()) return s;
    out.resynced = true;
    out.resync_reason = std::move(reason);
    out.version = round_;
    return out;
  };

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> delta(n_);
  for (uint64_t i = 0; i < n_; ++i) delta[i] = global_[i] - local[i];
  if (options_.error_feedback) {
    for (uint64_t i = 0; i < n_; ++i) delta[i] += residual_[i];
  }
  const PayloadId id{run_id_, island_id_, round_, options_.fragment};
  compression::Rounding rounding;
  if (options_.stochastic_rounding) {
    rounding.stochastic = true;
    rounding.seed = compression::math::Mix64(options_.seed ^ compression::math::Mix64(
                                                 (round_ << 20) ^ options_.fragment));
  }
  auto chunks = EncodeChunks(id, options_.codec, delta.data(), 0, n_, n_, options_.chunk_bytes,
                             rounding);
  if (!chunks.ok()) return chunks.status();  // e.g. a non-finite pseudo-gradient
  if (options_.error_feedback) {
    // The residual is what the service will not see: delta minus its decoded encoding.
    Assembler sent(id, n_, 0, n_, options_.codec);
    for (const auto& c : *chunks) {
      if (auto s = sent.Add(c); !s.ok()) return s;
    }
    for (uint64_t i = 0; i < n_; ++i) residual_[i] = delta[i] - sent.values()[i];
  }
  std::vector<pb::PushRequest> requests(chunks->size());
  for (size_t i = 0; i < chunks->size(); ++i) {
    *requests[i].mutable_chunk() = std::move((*chunks)[i]);
    requests[i].set_tokens(tokens);
    if (i == 0) requests[i].set_inner_steps_per_s(steps_per_s);
  }
  out.bytes_sent = WireBytes(requests);
  auto pushed = transport_->Push(requests);
  out.push_s = Since(t0);
  if (!pushed.ok()) {
    if (absl::IsFailedPrecondition(pushed.status())) {
      return resync(std::string(pushed.status().message()));
    }
    return pushed.status();
  }

  const auto t1 = std::chrono::steady_clock::now();
  out.contributors = pushed->contributors();
  // Sync: the round's update. Async: every version since the one this contribution started from,
  // its own included.
  const uint64_t until = options_.async ? pushed->version() : round_ + 1;
  if (options_.async) {
    out.staleness = pushed->staleness();
    out.sync_every = pushed->sync_every();
    out.tokens_committed = pushed->tokens_committed();
    out.budget_reached = pushed->budget_reached();
  }
  while (round_ < until) {
    const uint64_t r = round_;
    if (auto s = ApplyRound(r, out); !s.ok()) {
      if (absl::IsFailedPrecondition(s) || absl::IsDataLoss(s)) {
        if (absl::IsDataLoss(s)) {
          // Never expected: the same fp32 subtraction on the same inputs. Recover with the state.
          std::fprintf(stderr, "atoll: error: island '%s': %s; fetching the full state\n",
                       island_id_.c_str(), std::string(s.message()).c_str());
        }
        return resync(std::string(s.message()));
      }
      return s;
    }
  }
  out.wait_s = Since(t1);
  out.version = round_;
  return out;
}

absl::StatusOr<RoundOutcome> IslandSync::CatchUp(uint64_t version) {
  RoundOutcome out;
  out.round = round_;
  while (round_ < version) {
    if (auto s = ApplyRound(round_, out); !s.ok()) {
      if (!absl::IsFailedPrecondition(s) && !absl::IsDataLoss(s)) return s;
      if (auto f = FetchGlobal(); !f.ok()) return f;
      out.resynced = true;
      out.resync_reason = std::string(s.message());
    }
  }
  out.version = round_;
  return out;
}

absl::Status IslandSync::ApplyRound(uint64_t round, RoundOutcome& out) {
  pb::UpdateRequest request;
  request.set_run_id(run_id_);
  request.set_island_id(island_id_);
  request.set_round(round);
  request.set_fragment(options_.fragment);
  auto update = transport_->AwaitUpdate(request);
  if (!update.ok()) return update.status();
  out.bytes_received += WireBytes(*update);
  if (update->empty()) return absl::DataLossError("the service sent an empty update");
  Assembler assembler({run_id_, "", round, options_.fragment}, n_, 0, n_, options_.codec);
  for (const auto& u : *update) {
    if (auto s = assembler.Add(u.chunk()); !s.ok()) return s;
  }
  if (auto s = assembler.CheckComplete(); !s.ok()) return s;
  ApplyUpdate(global_.data(), assembler.values().data(), n_);
  if (!options_.async) out.contributors = update->front().contributors();
  round_ = round + 1;
  if (global_hash() != update->front().params_hash()) {
    return absl::DataLossError(absl::StrCat("global parameters after round ", round,
                                            " do not match the service's hash"));
  }
  return absl::OkStatus();
}

}  // namespace atl::outer
