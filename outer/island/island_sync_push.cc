// The island's push: the pseudo-gradient of its owned ranges, encoded chunk by chunk as the
// transport sends it (with error feedback and stochastic rounding), on every lane at once.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "compression/codec_math.h"
#include "compression/status_macros.h"
#include "outer/island/island_sync.h"
#include "outer/island/island_sync_internal.h"

namespace atl::outer {
namespace {

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

using internal::RunLanes;

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

// What every chunk of one push is encoded with.
struct IslandSync::PushPlan {
  PayloadId id;
  compression::Rounding rounding;
  uint64_t sample = 1;                      // elements of each chunk its error is measured on
  const std::vector<float>* local = nullptr;  // null: the device copy makes the pseudo-gradient
  bool keep_own = false;                    // keep the chunks for a relayed update
  std::vector<std::vector<Span>> parts;     // the lanes' chunks
};

// One lane's push: its answer, its encoding error, its bytes and (keep_own) its chunks.
struct IslandSync::PushLane {
  absl::StatusOr<pb::PushResponse> pushed;
  EncodingError error;
  uint64_t bytes = 0;
  std::vector<EncodedChunk> sent;
};

void IslandSync::Misbehave(const PayloadId& id, uint32_t chunk, std::vector<float>& delta) const {
  if (options_.fault == IslandSyncOptions::Fault::kSignFlip) {
    for (float& d : delta) d = -d;
    return;
  }
  double squares = 0;
  for (float d : delta) squares += double(d) * double(d);
  std::mt19937_64 rng(options_.seed ^ (id.round * 0x9E3779B97F4A7C15ULL) ^ (uint64_t(chunk) << 20) ^
                      id.fragment);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  double noise = 0;
  for (float& d : delta) {
    d = normal(rng);
    noise += double(d) * double(d);
  }
  const float scale = noise > 0 ? float(std::sqrt(squares / noise)) : 0.0f;
  for (float& d : delta) d *= scale;
}

absl::StatusOr<pb::Chunk> IslandSync::EncodePushChunk(const PushPlan& plan, const Span& c,
                                                     uint32_t index, uint32_t count,
                                                     std::vector<float>& delta,
                                                     std::vector<float>& decoded, PushLane& lane) {
  const uint64_t n = c.end - c.begin;
  absl::StatusOr<pb::Chunk> chunk;
  if (device_) {
    // Made and encoded on the device; `delta` receives the sample the error is measured on.
    delta.resize(std::min(n, plan.sample));
    chunk = EncodeChunkWith(plan.id, options_.codec, c.begin, n, fragment_elements_, index, count,
                            plan.rounding, [&](uint8_t* out, const compression::Rounding& r) {
                              return device_->Encode(options_.codec, c.at, n, r, out, delta.data(),
                                                     delta.size());
                            });
  } else {
    const std::vector<float>& local = *plan.local;
    delta.resize(n);
    for (uint64_t i = 0; i < n; ++i) delta[i] = global_[c.at + i] - local[c.at + i];
    if (options_.error_feedback) {
      const float beta = options_.error_feedback_decay;
      for (uint64_t i = 0; i < n; ++i) delta[i] += beta * residual_[c.at + i];
    }
    if (options_.fault != IslandSyncOptions::Fault::kNone &&
        (options_.fault_rounds == 0 || plan.id.round < options_.fault_rounds)) {
      Misbehave(plan.id, index, delta);
    }
    chunk = EncodeChunk(plan.id, options_.codec, delta.data(), c.begin, n, fragment_elements_,
                        index, count, plan.rounding);
  }
  if (!chunk.ok()) return chunk.status();  // e.g. a non-finite pseudo-gradient
  ATL_RETURN_IF_ERROR(SampleChunkError(*chunk, delta.data(), plan.sample, &lane.error));
  if (options_.error_feedback && !device_) {
    // The residual is what the service will not see: delta minus its decoded encoding.
    decoded.resize(n);
    const std::string& data = chunk->data();
    ATL_RETURN_IF_ERROR(compression::Decode(options_.codec,
                                            reinterpret_cast<const uint8_t*>(data.data()),
                                            data.size(), n, decoded.data()));
    for (uint64_t i = 0; i < n; ++i) next_residual_[c.at + i] = delta[i] - decoded[i];
  }
  if (plan.keep_own) lane.sent.push_back({c.begin, n, chunk->data()});
  return chunk;
}

absl::StatusOr<pb::PushResponse> IslandSync::TakeAnswers(std::vector<PushLane>& lanes,
                                                         bool keep_own, RoundOutcome& out) {
  EncodingError error;
  std::vector<absl::StatusOr<pb::PushResponse>> answers;
  std::vector<EncodedChunk> sent;
  for (auto& r : lanes) {
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

absl::StatusOr<pb::PushResponse> IslandSync::PushContribution(const std::vector<float>* local,
                                                              uint64_t tokens, double steps_per_s,
                                                              uint64_t step, RoundOutcome& out) {
  PushPlan plan;
  plan.id = {run_id_, island_id_, round_, options_.fragment};
  if (options_.stochastic_rounding) {
    plan.rounding.stochastic = true;
    plan.rounding.seed = compression::math::Mix64(
        options_.seed ^ compression::math::Mix64((round_ << 20) ^ options_.fragment));
  }
  plan.parts = PlanPush();
  size_t total_chunks = 0;
  for (const auto& part : plan.parts) total_chunks += part.size();
  plan.sample = std::max<uint64_t>(1, kErrorSampleElements / std::max<size_t>(1, total_chunks));
  plan.local = local;
  plan.keep_own = options_.codec.sparse() && !options_.async;
  const std::string session = identity_->session();

  std::vector<PushLane> lanes(plan.parts.size());
  // A push pulls its chunks from here: each encoded from global - local (+ the residual) as it is
  // sent, one stream per part, chunks numbered within it. A retry starts a fresh source (the
  // encoding is deterministic: the same bytes again).
  auto source = [&](size_t lane) -> PushSource {
    lanes[lane] = PushLane();
    return [&, lane, next = size_t(0), delta = std::vector<float>(),
            decoded = std::vector<float>()](pb::PushRequest* m) mutable -> absl::StatusOr<bool> {
      const auto& part = plan.parts[lane];
      if (next == part.size()) return false;
      ATL_ASSIGN_OR_RETURN(*m->mutable_chunk(),
                           EncodePushChunk(plan, part[next], uint32_t(next), uint32_t(part.size()),
                                           delta, decoded, lanes[lane]));
      m->set_tokens(tokens);
      if (next == 0) {
        m->set_inner_steps_per_s(steps_per_s);
        m->set_step(step);
        m->set_link_bps(link_bps_);
        m->set_session(session);
      }
      lanes[lane].bytes += m->ByteSizeLong();
      ++next;
      return true;
    };
  };
  RunLanes(int(plan.parts.size()), [&](int l) {
    auto pushed = PushRetrying([&, l] { return source(size_t(l)); }, l);
    lanes[size_t(l)].pushed = std::move(pushed);
  });
  return TakeAnswers(lanes, plan.keep_own, out);
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


}  // namespace atl::outer
