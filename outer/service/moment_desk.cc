#include "outer/service/moment_desk.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "outer/base/names.h"
#include "outer/base/moment_values.h"
#include "outer/base/payload.h"

namespace atl::outer {

namespace {

bool KnownOptimizer(const std::string& name) { return name == "adamw" || name == "muon"; }

// Whether [begin, end) meets one of `ranges`.
bool Overlaps(const std::vector<std::pair<uint64_t, uint64_t>>& ranges, uint64_t begin,
              uint64_t end) {
  for (const auto& [b, e] : ranges) {
    if (begin < e && b < end) return true;
  }
  return false;
}

}  // namespace

MomentDesk::MomentDesk(ServiceCore& core) : core_(core), fragments_(core.fragments.size()) {}

absl::StatusOr<std::unique_ptr<PushStream>> MomentDesk::OpenPush(const pb::PushRequest& first,
                                                                 Rounds* rounds) {
  const auto& h = first.chunk().header();
  ATL_RETURN_IF_ERROR(core_.CheckRun(h.run_id()));
  ATL_ASSIGN_OR_RETURN(auto fid, core_.CheckFragment(h.fragment()));
  if (core_.options.moment_sync_every == 0) {
    return absl::FailedPreconditionError(
        "this run does not average optimizer moments (outer.moment_sync_every = 0)");
  }
  if (!KnownOptimizer(first.moments())) {
    return absl::InvalidArgumentError(absl::StrCat("moments of an unknown optimizer ",
                                                   Printable(first.moments()),
                                                   " (adamw or muon)"));
  }
  const PayloadId id{core_.options.run_id, h.island_id(), h.round(), fid};
  {
    std::lock_guard<std::mutex> lock(core_.mu);
    ATL_RETURN_IF_ERROR(core_.membership.Authenticate(id.island_id, first.session()));
  }
  const FragmentLayout& layout = core_.fragments[fid].layout;
  // A rank's ranges of each channel (see Rounds::OpenPushChecked's bound).
  const size_t max_ranges = kChannels * std::max<size_t>(64, 4 * layout.names.size());
  auto stream = std::unique_ptr<PushStream>(
      new PushStream(rounds, ChunkStream(id, kCodec, kChannels * layout.total(), max_ranges),
                     h.offset(), first.session(), 0, first.step(), IslandFigures{}, nullptr));
  stream->moments_ = first.moments();
  return stream;
}

absl::StatusOr<std::vector<std::pair<uint64_t, std::vector<float>>>> MomentDesk::Decode(
    const EncodedPayload& payload, uint64_t n, const PayloadId& id) const {
  std::vector<std::pair<uint64_t, std::vector<float>>> ranges;
  for (const auto& [begin, end] : payload.Ranges()) {
    std::vector<float> values(end - begin);
    ATL_RETURN_IF_ERROR(payload.Read(begin, end - begin, values.data()));
    const std::string problem = MomentValuesProblem(values.data(), begin, values.size(), n);
    if (!problem.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("moments of island '", id.island_id,
                                                     "' for round ", id.round, " of fragment ",
                                                     id.fragment, ": ", problem));
    }
    ranges.emplace_back(begin, std::move(values));
  }
  return ranges;
}

absl::Status MomentDesk::CheckRoundLocked(const Fragment& m, uint32_t fragment, uint64_t round,
                                          uint64_t open_round) const {
  const uint32_t k = core_.options.moment_sync_every;
  if ((round + 1) % k != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", round, " of fragment ", fragment, " is not a moment round (every ", k, ")"));
  }
  if (round > open_round) {
    return absl::FailedPreconditionError(absl::StrCat("round ", round, " of fragment ", fragment,
                                                      " is in the future (the open round is ",
                                                      open_round, ")"));
  }
  // Only the newest moment round at or before the open one gathers: an older round's moments,
  // averaged now, would be published as the newest.
  const uint64_t newest = (open_round + 1) / k * k;  // + 1 (round + 1 <= open_round + 1 here)
  if (round + 1 < newest) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", round, " of fragment ", fragment, " is too late: round ", newest - 1,
        " is the newest moment round (the open round is ", open_round, ")"));
  }
  if (m.published != nullptr && round <= m.published->round) {
    return absl::FailedPreconditionError(
        absl::StrCat("the moments of round ", m.published->round, " of fragment ", fragment,
                     " were averaged already; round ", round, " is too late"));
  }
  if (m.open != nullptr && round < m.open->round) {
    return absl::FailedPreconditionError(absl::StrCat("round ", round, " of fragment ", fragment,
                                                      " is too late: round ", m.open->round,
                                                      "'s moments are being gathered"));
  }
  return absl::OkStatus();
}

absl::StatusOr<pb::PushResponse> MomentDesk::FinishPush(std::unique_ptr<PushStream> stream) {
  ATL_RETURN_IF_ERROR(stream->chunks_.CheckComplete());
  const PayloadId id = stream->chunks_.id();
  const uint64_t n = core_.fragments[id.fragment].layout.total();
  const EncodedPayload payload = std::move(stream->chunks_).Take();
  ATL_ASSIGN_OR_RETURN(auto ranges, Decode(payload, n, id));
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t open_round;
  {
    std::lock_guard<std::mutex> core_lock(core_.mu);
    ATL_RETURN_IF_ERROR(core_.membership.Authenticate(id.island_id, stream->session_));
    open_round = core_.fragments[id.fragment].round;
  }
  Fragment& m = fragments_[id.fragment];
  ATL_RETURN_IF_ERROR(CheckRoundLocked(m, id.fragment, id.round, open_round));
  if (m.open != nullptr && m.open->round != id.round) PublishLocked(m);
  if (m.open != nullptr && m.open->optimizer != stream->moments_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "moments of ", Printable(stream->moments_), " for round ", id.round, " of fragment ",
        id.fragment, ": this round gathers ", m.open->optimizer, "'s"));
  }
  if (m.open != nullptr) {
    auto given = m.open->given.find(id.island_id);
    for (const auto& [begin, values] : ranges) {
      if (given != m.open->given.end() && Overlaps(given->second, begin, begin + values.size())) {
        return absl::AlreadyExistsError(absl::StrCat(
            "island '", id.island_id, "' gave moments of elements [", begin, ", ",
            begin + values.size(), ") of fragment ", id.fragment, " for round ", id.round,
            " already"));
      }
    }
  }
  if (m.open == nullptr) {
    m.open = std::make_unique<Gathered>();
    m.open->round = id.round;
    m.open->optimizer = stream->moments_;
    m.open->values.assign(kChannels * n, 0.0f);
    m.open->counts.assign(kChannels * n, 0);
  }
  auto& given = m.open->given[id.island_id];
  for (const auto& [begin, values] : ranges) {
    float* sum = m.open->values.data() + begin;
    uint16_t* count = m.open->counts.data() + begin;
    for (size_t i = 0; i < values.size(); ++i) {
      sum[i] += values[i];
      count[i] = uint16_t(std::min<int>(count[i] + 1, UINT16_MAX));
    }
    given.emplace_back(begin, begin + values.size());
  }
  pb::PushResponse response;
  response.set_round(id.round);
  response.set_fragment(id.fragment);
  response.set_contributors(uint32_t(m.open->given.size()));
  return response;
}

void MomentDesk::PublishLocked(Fragment& m) {
  if (m.open == nullptr) return;
  Gathered& g = *m.open;
  for (size_t i = 0; i < g.values.size(); ++i) {
    if (g.counts[i] > 0) g.values[i] /= float(g.counts[i]);
  }
  g.given.clear();
  m.published = std::shared_ptr<const Gathered>(std::move(m.open));
}

absl::Status MomentDesk::FetchMoments(const pb::FetchStateRequest& request,
                                      const std::function<bool(pb::StateChunk&&)>& write) {
  ATL_RETURN_IF_ERROR(core_.CheckRun(request.run_id()));
  ATL_ASSIGN_OR_RETURN(auto fid, core_.CheckFragment(request.fragment()));
  const uint64_t want = request.moments_round();
  std::shared_ptr<const Gathered> average;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t open_round;
    {
      std::lock_guard<std::mutex> core_lock(core_.mu);
      ATL_RETURN_IF_ERROR(core_.membership.Authenticate(request.island_id(), request.session()));
      open_round = core_.fragments[fid].round;
    }
    if (want != 0 && want >= open_round) {
      return absl::FailedPreconditionError(absl::StrCat(
          "round ", want, " of fragment ", fid, " has not committed: its moments may still come"));
    }
    Fragment& m = fragments_[fid];
    // A committed round's moments are all in: its contributors pushed them before their parts.
    if (m.open != nullptr && m.open->round < open_round && (want == 0 || m.open->round == want)) {
      PublishLocked(m);
    }
    average = m.published;
  }
  if (average == nullptr) {
    return absl::NotFoundError(absl::StrCat("no moments of fragment ", fid, " were averaged yet"));
  }
  if (want != 0 && average->round != want) {
    return absl::FailedPreconditionError(absl::StrCat("the moments of round ", want,
                                                      " of fragment ", fid,
                                                      " are not kept (the newest are of round ",
                                                      average->round, ")"));
  }
  if (average->optimizer != request.moments()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the moments of round ", average->round, " of fragment ", fid, " are ",
        average->optimizer, "'s, not ", Printable(request.moments()), "'s"));
  }
  const uint64_t total = average->values.size();
  ATL_RETURN_IF_ERROR(CheckRange(request.offset(), request.num_elements(), total, fid));
  const uint64_t n = request.num_elements() == 0 ? total - request.offset() : request.num_elements();
  const uint16_t* counts = average->counts.data() + request.offset();
  if (std::find(counts, counts + n, 0) != counts + n) {
    return absl::NotFoundError(absl::StrCat("no island gave the moments of elements [",
                                            request.offset(), ", ", request.offset() + n,
                                            ") of fragment ", fid, " for round ", average->round));
  }
  const ChunkPlan plan = PlanChunks(kCodec, n, core_.options.chunk_bytes);
  for (uint32_t c = 0; c < plan.num_chunks; ++c) {
    const uint64_t first = uint64_t(c) * plan.per_chunk;
    const uint64_t count = std::min(plan.per_chunk, n - first);
    pb::StateChunk out;
    ATL_ASSIGN_OR_RETURN(
        auto chunk, EncodeChunk({core_.options.run_id, "", average->round, fid}, kCodec,
                                average->values.data() + request.offset() + first,
                                request.offset() + first, count, total, c, plan.num_chunks));
    *out.mutable_chunk() = std::move(chunk);
    if (!write(std::move(out))) return absl::CancelledError("the caller went away");
  }
  return absl::OkStatus();
}

int64_t MomentDesk::published_round(uint32_t fragment) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto& p = fragments_.at(fragment).published;
  return p == nullptr ? -1 : int64_t(p->round);
}

}  // namespace atl::outer
