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
#include "outer/base/update_recipe.h"

namespace atl::outer {
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Runs body(lane) for lanes 0 .. n - 1 at once, lane 0 on the calling thread.
void RunLanes(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int lane = 1; lane < n; ++lane) threads.emplace_back(body, lane);
  body(0);
  for (auto& t : threads) t.join();
}

absl::Status FirstError(const std::vector<absl::Status>& statuses) {
  for (const auto& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Cuts items of the given weights into at most n contiguous, non-empty groups of about equal
// weight: group g ends at the item boundary nearest to (g + 1) / groups of the total. Returns
// each group's first item and, last, the number of items.
std::vector<size_t> Cut(const std::vector<uint64_t>& weights, int n) {
  const size_t groups = std::min<size_t>(size_t(std::max(1, n)), weights.size());
  std::vector<uint64_t> sum(weights.size() + 1, 0);  // sum[i]: weight of items [0, i)
  for (size_t i = 0; i < weights.size(); ++i) sum[i + 1] = sum[i] + weights[i];
  std::vector<size_t> starts{0};
  for (size_t g = 1; g < groups; ++g) {
    const double target = double(sum.back()) * double(g) / double(groups);
    // Leave at least one item for each group after this one.
    size_t best = starts.back() + 1;
    for (size_t i = best; i <= weights.size() - (groups - g); ++i) {
      if (std::fabs(double(sum[i]) - target) < std::fabs(double(sum[best]) - target)) best = i;
    }
    starts.push_back(best);
  }
  starts.push_back(weights.size());
  return starts;
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
  return compression::Checksum(global_.data(), global_.size() * sizeof(float));
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
    if (s.ok() && compression::Checksum(out, count * sizeof(float)) != range_hash) {
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
    const bool transient = absl::IsUnavailable(s) || absl::IsDataLoss(s) ||
                           absl::IsDeadlineExceeded(s) || absl::IsResourceExhausted(s);
    if (!transient || tries >= options_.retries) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50 << (tries + 1), 2000)));
  }
}

absl::Status IslandSync::Adopt(std::vector<float> values, uint64_t round, uint64_t hash) {
  if (!carried() || !whole() || values.size() != n_ || hash == 0 ||
      compression::Checksum(values.data(), n_ * sizeof(float)) != hash) {
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
    if (whole() && compression::Checksum(values.data(), n_ * sizeof(float)) != progress.hash) {
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

std::vector<std::vector<IslandSync::Span>> IslandSync::PlanPush() const {
  std::vector<std::vector<Span>> per_range;
  for (uint64_t at = 0, r = 0; r < ranges_.size(); ++r) {
    const auto [begin, end] = ranges_[r];
    const ChunkPlan plan = PlanChunks(options_.codec, end - begin, options_.chunk_bytes);
    auto& chunks = per_range.emplace_back();
    for (uint64_t c = 0; c < plan.num_chunks; ++c) {
      const uint64_t first = c * plan.per_chunk;
      chunks.push_back({at + first, begin + first, begin + std::min(end - begin, first + plan.per_chunk)});
    }
    at += end - begin;
  }
  std::vector<std::vector<Span>> parts;
  if (whole()) {
    std::vector<uint64_t> weights;
    for (const auto& c : per_range[0]) weights.push_back(c.end - c.begin);
    const auto starts = Cut(weights, lanes());
    for (size_t g = 0; g + 1 < starts.size(); ++g) {
      parts.emplace_back(per_range[0].begin() + int64_t(starts[g]),
                         per_range[0].begin() + int64_t(starts[g + 1]));
    }
  } else {
    std::vector<uint64_t> weights;
    for (const auto& [b, e] : ranges_) weights.push_back(e - b);
    const auto starts = Cut(weights, lanes());
    for (size_t g = 0; g + 1 < starts.size(); ++g) {
      auto& part = parts.emplace_back();
      for (size_t r = starts[g]; r < starts[g + 1]; ++r) {
        part.insert(part.end(), per_range[r].begin(), per_range[r].end());
      }
    }
  }
  return parts;
}

// A push that did not arrive intact is sent again; if a retried push finds its first attempt
// applied after all (the answer was lost), the round goes on as if it had been answered.
absl::StatusOr<pb::PushResponse> IslandSync::PushRetrying(
    const std::function<PushSource()>& source, int lane) {
  auto pushed = transport_->Push(source(), lane);
  for (int tries = 0; tries < options_.retries && (absl::IsUnavailable(pushed.status()) ||
                                                   absl::IsDataLoss(pushed.status()) ||
                                                   absl::IsResourceExhausted(pushed.status()));
       ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100 << tries));
    pushed = transport_->Push(source(), lane);
    if (absl::IsAlreadyExists(pushed.status()) && !options_.async) {
      pushed = pb::PushResponse();
      pushed->set_round(round_);
    }
  }
  return pushed;
}

namespace {

// The parts' answers to one contribution: the part that completed it speaks for it (the most
// contributors); any part may carry the tau the service chose. The first part's error, if any.
absl::StatusOr<pb::PushResponse> CombineAnswers(
    const std::vector<absl::StatusOr<pb::PushResponse>>& parts) {
  absl::StatusOr<pb::PushResponse> answer;
  for (const auto& pushed : parts) {
    if (!pushed.ok()) return pushed.status();
    if (!answer.ok() || pushed->contributors() > answer->contributors()) {
      const bool tau_set = answer.ok() && answer->tau_set();
      const uint32_t tau = answer.ok() ? answer->tau() : 0;
      answer = pushed;
      if (tau_set && !answer->tau_set()) {
        answer->set_tau_set(true);
        answer->set_tau(tau);
      }
    } else if (pushed->tau_set() && !answer->tau_set()) {
      answer->set_tau_set(true);
      answer->set_tau(pushed->tau());
    }
  }
  return answer;
}

}  // namespace

absl::StatusOr<pb::PushResponse> IslandSync::PushContribution(const std::vector<float>* local,
                                                              uint64_t tokens, double steps_per_s,
                                                              RoundOutcome& out) {
  const PayloadId id{run_id_, island_id_, round_, options_.fragment};
  compression::Rounding rounding;
  if (options_.stochastic_rounding) {
    rounding.stochastic = true;
    rounding.seed = compression::math::Mix64(options_.seed ^ compression::math::Mix64(
                                                 (round_ << 20) ^ options_.fragment));
  }
  const auto parts = PlanPush();
  size_t total_chunks = 0;
  for (const auto& part : parts) total_chunks += part.size();
  const uint64_t sample = std::max<uint64_t>(1, kErrorSampleElements / std::max<size_t>(1, total_chunks));
  const std::string session = identity_->session();

  struct Lane {
    absl::StatusOr<pb::PushResponse> pushed;
    EncodingError error;
    uint64_t bytes = 0;
    std::vector<EncodedChunk> sent;  // kept for a relayed update (sparse codecs)
  };
  const bool keep_own = options_.codec.sparse() && !options_.async;
  std::vector<Lane> results(parts.size());
  // A push pulls its chunks from here: each encoded from global - local (+ the residual) as it is
  // sent, one stream per part, chunks numbered within it. A retry starts a fresh source (the
  // encoding is deterministic: the same bytes again).
  auto source = [&](size_t lane) -> PushSource {
    results[lane].error = EncodingError();
    results[lane].bytes = 0;
    results[lane].sent.clear();
    return [&, lane, next = size_t(0), delta = std::vector<float>(),
            decoded = std::vector<float>()](pb::PushRequest* m) mutable -> absl::StatusOr<bool> {
      const auto& part = parts[lane];
      if (next == part.size()) return false;
      const Span& c = part[next];
      const uint64_t n = c.end - c.begin;
      absl::StatusOr<pb::Chunk> chunk;
      if (device_) {
        // Made and encoded on the device; `delta` receives the sample the error is measured on.
        delta.resize(std::min(n, sample));
        chunk = EncodeChunkWith(id, options_.codec, c.begin, n, fragment_elements_, uint32_t(next),
                                uint32_t(part.size()), rounding,
                                [&](uint8_t* out, const compression::Rounding& r) {
                                  return device_->Encode(options_.codec, c.at, n, r, out,
                                                         delta.data(), delta.size());
                                });
      } else {
        delta.resize(n);
        for (uint64_t i = 0; i < n; ++i) delta[i] = global_[c.at + i] - (*local)[c.at + i];
        if (options_.error_feedback) {
          const float beta = options_.error_feedback_decay;
          for (uint64_t i = 0; i < n; ++i) delta[i] += beta * residual_[c.at + i];
        }
        chunk = EncodeChunk(id, options_.codec, delta.data(), c.begin, n, fragment_elements_,
                            uint32_t(next), uint32_t(part.size()), rounding);
      }
      if (!chunk.ok()) return chunk.status();  // e.g. a non-finite pseudo-gradient
      ATL_RETURN_IF_ERROR(SampleChunkError(*chunk, delta.data(), sample, &results[lane].error));
      if (options_.error_feedback && !device_) {
        // The residual is what the service will not see: delta minus its decoded encoding.
        decoded.resize(n);
        const std::string& data = chunk->data();
        ATL_RETURN_IF_ERROR(compression::Decode(options_.codec,
                                                reinterpret_cast<const uint8_t*>(data.data()),
                                                data.size(), n, decoded.data()));
        for (uint64_t i = 0; i < n; ++i) next_residual_[c.at + i] = delta[i] - decoded[i];
      }
      if (keep_own) results[lane].sent.push_back({c.begin, n, chunk->data()});
      *m->mutable_chunk() = *std::move(chunk);
      m->set_tokens(tokens);
      if (next == 0) {
        m->set_inner_steps_per_s(steps_per_s);
        m->set_link_bps(link_bps_);
        m->set_session(session);
      }
      results[lane].bytes += m->ByteSizeLong();
      ++next;
      return true;
    };
  };
  RunLanes(int(parts.size()), [&](int l) {
    results[size_t(l)].pushed = PushRetrying([&, l] { return source(size_t(l)); }, l);
  });
  EncodingError error;
  std::vector<absl::StatusOr<pb::PushResponse>> answers;
  std::vector<EncodedChunk> sent;
  for (auto& r : results) {
    out.bytes_sent += r.bytes;
    error.Add(r.error);
    answers.push_back(std::move(r.pushed));
    std::move(r.sent.begin(), r.sent.end(), std::back_inserter(sent));
  }
  ATL_ASSIGN_OR_RETURN(auto answer, CombineAnswers(answers));
  if (keep_own) KeepOwn(std::move(sent));
  out.quantization_error = error.relative();
  if (options_.error_feedback) {
    if (device_) {
      device_->KeepResidual();
    } else {
      std::lock_guard<std::mutex> lock(residual_mu_);
      residual_.swap(next_residual_);
    }
  }
  return answer;
}

void IslandSync::KeepOwn(std::vector<EncodedChunk> sent) {
  std::sort(sent.begin(), sent.end(),
            [](const EncodedChunk& a, const EncodedChunk& b) { return a.offset < b.offset; });
  own_ = EncodedPayload();
  own_.codec = options_.codec;
  for (const auto& c : sent) own_.elements += c.count;
  own_.chunks = std::move(sent);
  own_round_ = round_;
}

absl::StatusOr<RoundOutcome> IslandSync::SyncRound(const std::vector<float>& local,
                                                   uint64_t tokens, double steps_per_s) {
  if (device_) {
    return absl::FailedPreconditionError("this fragment's pseudo-gradient is made on the device");
  }
  if (local.size() != n_) {
    return absl::InvalidArgumentError(
        absl::StrCat("local parameters have ", local.size(), " elements, expected ", n_));
  }
  return Round(&local, tokens, steps_per_s);
}

absl::StatusOr<RoundOutcome> IslandSync::SyncRoundOnDevice(uint64_t tokens, double steps_per_s) {
  if (!device_ && carried()) {
    return absl::FailedPreconditionError("this fragment has no device copy");
  }
  return Round(nullptr, tokens, steps_per_s);
}

void IslandSync::set_device_copy(DeviceCopy* copy) { device_ = copy && carried() ? copy : nullptr; }

absl::StatusOr<RoundOutcome> IslandSync::Round(const std::vector<float>* local, uint64_t tokens,
                                               double steps_per_s) {
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

  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<pb::PushResponse> pushed = PushContribution(local, tokens, steps_per_s, out);
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

// Accepted chunks as they arrived (encoded), for the device copy: owned elements [at, at + count).
struct IslandSync::Received {
  absl::Status status;
  uint64_t bytes = 0, params_hash = 0;
  uint32_t contributors = 0;
  struct Owned {
    uint64_t at = 0, count = 0;
    compression::CodecSpec spec;
    std::string data;
  };
  std::vector<Owned> chunks;
};

std::vector<IslandSync::Span> IslandSync::PlanReceive(bool split) const {
  std::vector<Span> parts;
  if (split) {
    const uint64_t block = std::max<uint32_t>(1, options_.codec.block_size);
    const uint64_t blocks = (n_ + block - 1) / block;
    const uint64_t k = std::min<uint64_t>(uint64_t(lanes()), blocks);
    for (uint64_t g = 0; g < k; ++g) {
      const uint64_t b = std::min(n_, blocks * g / k * block);
      const uint64_t e = std::min(n_, blocks * (g + 1) / k * block);
      if (e > b) parts.push_back({b, b, e});
    }
    return parts;
  }
  for (uint64_t at = 0, r = 0; r < ranges_.size(); ++r) {
    parts.push_back({at, ranges_[r].first, ranges_[r].second});
    at += ranges_[r].second - ranges_[r].first;
  }
  return parts;
}

void IslandSync::ReceivePart(const Span& p, uint64_t round, bool split, int lane,
                             std::vector<float>& next, Received& got) {
  pb::UpdateRequest request;
  request.set_run_id(run_id_);
  request.set_island_id(island_id_);
  request.set_session(identity_->session());
  request.set_round(round);
  request.set_fragment(options_.fragment);
  request.set_offset(whole() && !split ? 0 : p.begin);
  request.set_num_elements(whole() && !split ? 0 : p.end - p.begin);
  const bool holds_own = own_round_ == round && !own_.chunks.empty();
  request.set_holds_own(holds_own);
  uint64_t range_hash = 0;
  auto receive = [&]() {
    // Each chunk is applied as it arrives; a retry starts again from the global copy.
    std::copy(global_.begin() + int64_t(p.at), global_.begin() + int64_t(p.at + p.end - p.begin),
              next.begin() + int64_t(p.at));
    got.bytes = 0;
    got.chunks.clear();
    Assembler assembler({run_id_, "", round, options_.fragment}, fragment_elements_, p.begin,
                        p.end - p.begin, UpdateEncoding(options_.codec),
                        [&](uint64_t first, const float* u, uint64_t k) {
                          ApplyUpdate(next.data() + p.at + (first - p.begin), u, size_t(k));
                        });
    // A relayed update (its messages carry a recipe) is made here once all of it has arrived.
    std::optional<RelayReceiver> relay;
    bool encoded = false;
    absl::Status s = transport_->AwaitUpdate(
        request,
        [&](pb::UpdateChunk&& c) {
          got.bytes += c.ByteSizeLong();
          range_hash = c.range_hash();
          got.params_hash = c.params_hash();
          got.contributors = c.contributors();
          if (c.has_recipe() != relay.has_value() && (relay.has_value() || encoded)) {
            return absl::InvalidArgumentError("an update mixes relayed and encoded chunks");
          }
          if (c.has_recipe()) {
            if (!relay) {
              relay.emplace(PayloadId{run_id_, island_id_, round, options_.fragment},
                            options_.codec, fragment_elements_, p.begin, p.end,
                            holds_own ? &own_ : nullptr);
            }
            return relay->Add(std::move(c));
          }
          encoded = true;
          absl::Status added = assembler.Add(c.chunk());
          if (added.ok() && device_) {
            const auto& h = c.chunk().header();
            got.chunks.push_back({p.at + (h.offset() - p.begin), h.num_elements(), *SpecOf(h),
                                  std::move(*c.mutable_chunk()->mutable_data())});
          }
          return added;
        },
        lane);
    if (!s.ok()) return s;
    if (!relay) return assembler.CheckComplete();
    ATL_ASSIGN_OR_RETURN(const std::vector<float> u, relay->Finish());
    ApplyUpdate(next.data() + p.at, u.data(), u.size());
    if (device_) {
      // The device copy subtracts the same u (exact in fp32).
      got.chunks.push_back({p.at, u.size(), {compression::Codec::kFp32, 0},
                            std::string(reinterpret_cast<const char*>(u.data()),
                                        u.size() * sizeof(float))});
    }
    return absl::OkStatus();
  };
  got.status = receive();
  for (int tries = 0; tries < options_.retries && (absl::IsUnavailable(got.status) ||
                                                   absl::IsResourceExhausted(got.status));
       ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100 << tries));
    got.status = receive();
  }
  if (!got.status.ok() || split) return;
  if (range_hash == 0) {
    got.status = absl::FailedPreconditionError(absl::StrCat(
        "the service did not know the range [", p.begin, ", ", p.end, ") at round ", round));
  } else if (compression::Checksum(next.data() + p.at, (p.end - p.begin) * sizeof(float)) !=
             range_hash) {
    got.status = absl::DataLossError(absl::StrCat("global parameters [", p.begin, ", ", p.end,
                                                  ") after round ", round,
                                                  " do not match the service's hash"));
  }
}

absl::Status IslandSync::CheckSplitHash(const std::vector<Received>& received, uint64_t round,
                                        const std::vector<float>& next) const {
  for (const auto& r : received) {
    if (r.params_hash != received[0].params_hash) {
      return absl::DataLossError("the parts of an update disagree on the parameters' hash");
    }
  }
  if (compression::Checksum(next.data(), n_ * sizeof(float)) != received[0].params_hash) {
    return absl::DataLossError(absl::StrCat("global parameters after round ", round,
                                            " do not match the service's hash"));
  }
  return absl::OkStatus();
}

absl::Status IslandSync::ApplyRound(uint64_t round, RoundOutcome& out) {
  const bool split = whole() && lanes() > 1;
  const std::vector<Span> parts = PlanReceive(split);
  std::vector<float> next = global_;
  std::vector<Received> received(parts.size());
  const int n_lanes = int(std::min<size_t>(size_t(lanes()), parts.size()));
  RunLanes(n_lanes, [&](int lane) {
    for (size_t i = size_t(lane); i < parts.size(); i += size_t(n_lanes)) {
      ReceivePart(parts[i], round, split, lane, next, received[i]);
    }
  });
  std::vector<absl::Status> statuses;
  for (const auto& r : received) {
    statuses.push_back(r.status);
    out.bytes_received += r.bytes;
  }
  ATL_RETURN_IF_ERROR(FirstError(statuses));
  if (split) ATL_RETURN_IF_ERROR(CheckSplitHash(received, round, next));
  if (!options_.async) out.contributors = received[0].contributors;
  global_ = std::move(next);
  round_ = round + 1;
  if (device_) {
    // The same chunks, decoded on the device: its copy stays equal to the one just checked. Should
    // it fail there, the full state reloads both.
    for (const auto& r : received) {
      for (const auto& c : r.chunks) {
        if (auto s = device_->Apply(c.spec, c.at, c.count, c.data); !s.ok()) {
          return absl::FailedPreconditionError(
              absl::StrCat("the device copy could not apply round ", round, ": ", s.message()));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace atl::outer
