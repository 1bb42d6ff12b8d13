#include "outer/island_sync.h"

#include <algorithm>
#include <chrono>
#include <thread>

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

IslandSync::IslandSync(Transport* transport, std::string run_id,
                       std::shared_ptr<const IslandIdentity> identity, uint64_t fragment_elements,
                       IslandSyncOptions options)
    : transport_(transport),
      run_id_(std::move(run_id)),
      island_id_(identity->island_id()),
      identity_(std::move(identity)),
      fragment_elements_(fragment_elements),
      ranges_(options.ranges.empty()
                  ? std::vector<std::pair<uint64_t, uint64_t>>{{0, fragment_elements}}
                  : options.ranges),
      options_(options) {
  n_ = 0;
  for (const auto& [b, e] : ranges_) n_ += e - b;
  residual_.assign(options.error_feedback ? n_ : 0, 0.0f);
  global_.assign(n_, 0.0f);
}

uint64_t IslandSync::global_hash() const {
  return compression::Checksum(global_.data(), global_.size() * sizeof(float));
}

absl::Status IslandSync::FetchRange(uint64_t begin, uint64_t end, float* values, uint64_t* round,
                                    uint64_t* hash, bool* changed, uint64_t* bytes) {
  const uint64_t piece = std::max<uint64_t>(1, options_.fetch_piece_bytes / sizeof(float));
  for (uint64_t offset = begin; offset < end;) {
    const uint64_t count = std::min(piece, end - offset);
    pb::FetchStateRequest request;
    request.set_run_id(run_id_);
    request.set_island_id(island_id_);
    request.set_session(identity_->session());
    request.set_fragment(options_.fragment);
    request.set_offset(offset);
    request.set_num_elements(count);
    int tries = 0;
    while (true) {
      auto chunks = transport_->FetchState(request);
      absl::Status s = chunks.status();
      if (absl::IsAborted(s)) {
        *changed = true;  // a round committed while the range was sent: start over
        return absl::OkStatus();
      }
      if (chunks.ok() && chunks->empty()) s = absl::DataLossError("the service sent no state");
      if (s.ok()) {
        const auto& h0 = chunks->front().chunk().header();
        if (*round != UINT64_MAX &&
            (h0.round() != *round || chunks->front().params_hash() != *hash)) {
          *changed = true;  // a round committed in between: start over
          return absl::OkStatus();
        }
        *round = h0.round();
        *hash = chunks->front().params_hash();
        Assembler assembler({run_id_, h0.island_id(), *round, options_.fragment},
                            fragment_elements_, offset, count);
        for (const auto& c : *chunks) {
          if (c.params_hash() != *hash || c.range_hash() != chunks->front().range_hash()) {
            s = absl::DataLossError("state chunks disagree on the parameters' hash");
            break;
          }
          if (s = assembler.Add(c.chunk()); !s.ok()) break;
        }
        if (s.ok()) s = assembler.CheckComplete();
        if (s.ok() && compression::Checksum(assembler.values().data(), count * sizeof(float)) !=
                          chunks->front().range_hash()) {
          s = absl::DataLossError("fetched state does not match its hash");
        }
        if (s.ok()) {
          std::copy(assembler.values().begin(), assembler.values().end(), values + (offset - begin));
          *bytes += WireBytes(*chunks);
          break;
        }
      }
      const bool transient = absl::IsUnavailable(s) || absl::IsDataLoss(s) ||
                             absl::IsDeadlineExceeded(s) || absl::IsResourceExhausted(s);
      if (!transient || ++tries > options_.retries) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50 << tries, 2000)));
    }
    offset += count;
  }
  return absl::OkStatus();
}

absl::Status IslandSync::FetchGlobal() {
  absl::Status last = absl::OkStatus();
  for (int attempt = 0; attempt <= options_.retries; ++attempt) {
    std::vector<float> values(n_);
    uint64_t round = UINT64_MAX, hash = 0, bytes = 0, at = 0;
    bool changed = false;
    for (const auto& [begin, end] : ranges_) {
      if (auto s = FetchRange(begin, end, values.data() + at, &round, &hash, &changed, &bytes);
          !s.ok()) {
        return s;
      }
      if (changed) break;
      at += end - begin;
    }
    if (changed) continue;
    if (whole() && compression::Checksum(values.data(), n_ * sizeof(float)) != hash) {
      last = absl::DataLossError("fetched state does not match its hash");
      continue;
    }
    global_ = std::move(values);
    round_ = round;
    fetched_bytes_ += bytes;
    return absl::OkStatus();
  }
  return last.ok() ? absl::AbortedError("the global state kept changing during the transfer") : last;
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
  // One stream for all the owned ranges, chunks numbered across them.
  std::vector<pb::Chunk> all;
  EncodingError error;
  for (uint64_t at = 0, r = 0; r < ranges_.size(); ++r) {
    const auto [begin, end] = ranges_[r];
    auto chunks = EncodeChunks(id, options_.codec, delta.data() + at, begin, end - begin,
                               fragment_elements_, options_.chunk_bytes, rounding);
    if (!chunks.ok()) return chunks.status();  // e.g. a non-finite pseudo-gradient
    if (auto s = SampleEncodingError(*chunks, delta.data() + at, begin,
                                     kErrorSampleElements / ranges_.size(), &error);
        !s.ok()) {
      return s;
    }
    if (options_.error_feedback) {
      // The residual is what the service will not see: delta minus its decoded encoding.
      Assembler sent(id, fragment_elements_, begin, end - begin, options_.codec);
      for (const auto& c : *chunks) {
        if (auto s = sent.Add(c); !s.ok()) return s;
      }
      for (uint64_t i = 0; i < end - begin; ++i) residual_[at + i] = delta[at + i] - sent.values()[i];
    }
    for (auto& c : *chunks) all.push_back(std::move(c));
    at += end - begin;
  }
  for (size_t i = 0; i < all.size(); ++i) {
    all[i].mutable_header()->set_chunk_index(uint32_t(i));
    all[i].mutable_header()->set_num_chunks(uint32_t(all.size()));
  }
  out.quantization_error = error.relative();
  auto* chunks = &all;
  std::vector<pb::PushRequest> requests(chunks->size());
  for (size_t i = 0; i < chunks->size(); ++i) {
    *requests[i].mutable_chunk() = std::move((*chunks)[i]);
    requests[i].set_tokens(tokens);
    if (i == 0) {
      requests[i].set_inner_steps_per_s(steps_per_s);
      requests[i].set_link_bps(link_bps_);
      requests[i].set_session(identity_->session());
    }
  }
  out.bytes_sent = WireBytes(requests);
  // A push that did not arrive intact is sent again; if a retried push finds its first attempt
  // applied after all (the answer was lost), the round goes on as if it had been answered.
  absl::StatusOr<pb::PushResponse> pushed = transport_->Push(requests);
  for (int tries = 0; tries < options_.retries && (absl::IsUnavailable(pushed.status()) ||
                                                   absl::IsDataLoss(pushed.status()) ||
                                                   absl::IsResourceExhausted(pushed.status()));
       ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100 << tries));
    pushed = transport_->Push(requests);
    if (absl::IsAlreadyExists(pushed.status()) && !options_.async) {
      pushed = pb::PushResponse();
      pushed->set_round(round_);
    }
  }
  out.push_s = Since(t0);
  if (!pushed.ok()) {
    // Stale or unknown round; or (async) a retried push that had been applied after all, whose
    // version this island does not know: the full state puts it right.
    if (absl::IsFailedPrecondition(pushed.status()) ||
        (options_.async && absl::IsAlreadyExists(pushed.status()))) {
      return resync(std::string(pushed.status().message()));
    }
    return pushed.status();
  }

  const auto t1 = std::chrono::steady_clock::now();
  out.contributors = pushed->contributors();
  if (pushed->tau_set()) out.tau = int(pushed->tau());
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
  request.set_session(identity_->session());
  request.set_round(round);
  request.set_fragment(options_.fragment);
  // Each owned range separately (whole fragment: num_elements 0), checked against its hash.
  std::vector<float> next = global_;
  for (uint64_t at = 0, r = 0; r < ranges_.size(); ++r) {
    const auto [begin, end] = ranges_[r];
    request.set_offset(whole() ? 0 : begin);
    request.set_num_elements(whole() ? 0 : end - begin);
    auto update = transport_->AwaitUpdate(request);
    for (int tries = 0; tries < options_.retries && (absl::IsUnavailable(update.status()) ||
                                                     absl::IsResourceExhausted(update.status()));
         ++tries) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100 << tries));
      update = transport_->AwaitUpdate(request);
    }
    if (!update.ok()) return update.status();
    out.bytes_received += WireBytes(*update);
    if (update->empty()) return absl::DataLossError("the service sent an empty update");
    Assembler assembler({run_id_, "", round, options_.fragment}, fragment_elements_, begin,
                        end - begin, options_.codec);
    for (const auto& u : *update) {
      if (auto s = assembler.Add(u.chunk()); !s.ok()) return s;
    }
    if (auto s = assembler.CheckComplete(); !s.ok()) return s;
    ApplyUpdate(next.data() + at, assembler.values().data(), end - begin);
    const uint64_t want = update->front().range_hash();
    if (want == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the service did not know the range [", begin, ", ", end, ") at round ", round));
    }
    if (compression::Checksum(next.data() + at, (end - begin) * sizeof(float)) != want) {
      return absl::DataLossError(absl::StrCat("global parameters [", begin, ", ", end,
                                              ") after round ", round,
                                              " do not match the service's hash"));
    }
    if (!options_.async) out.contributors = update->front().contributors();
    at += end - begin;
  }
  global_ = std::move(next);
  round_ = round + 1;
  return absl::OkStatus();
}

}  // namespace atl::outer
