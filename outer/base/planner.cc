#include "outer/base/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "compression/codec.h"
#include "compression/status_macros.h"
#include "outer/base/fragments.h"
#include "outer/base/payload.h"
#include "outer/base/update_recipe.h"

namespace atl::outer {
namespace {

constexpr int64_t kMaxSteps = 10'000'000;
constexpr int kSteadyRounds = 30, kWarmupRounds = 10;

double Bits(uint64_t bytes) { return 8.0 * double(bytes); }

// What an island's transfers get: its link, and through the service's link its share of it.
double StarRate(const PlanInput& in) {
  const double rate = in.link.RateBps();
  if (in.topology != PlanTopology::kStar || !(in.service_bandwidth_bps > 0)) return rate;
  return std::min(rate, in.service_bandwidth_bps / in.islands);
}

// The service's commit of one fragment's contributions from every island, on its threads.
double CommitSeconds(const PlanInput& in, uint64_t elements) {
  const double p = in.commit_parallel_fraction;
  const double share = (1 - p) + p / double(std::max(1, in.service_threads));
  if (in.codec.sparse() && in.linear_outer_step) {  // in the values kept, not the parameters
    const double kept = double(elements) / double(in.codec.block_size) * double(in.codec.topk);
    return in.sparse_commit_s_per_value * kept * in.islands * share;
  }
  return in.commit_s_per_param * double(elements) * in.islands * share;
}

// One island's run, replayed step by step (islands are alike: they push together, so the service
// commits when the island's own push has arrived).
class Replay {
 public:
  explicit Replay(const PlanInput& in) : in_(in), rate_(StarRate(in)) {
    for (uint64_t n : in.fragment_elements) {
      bytes_.push_back(compression::EncodedBytes(in.codec, size_t(n)));
      down_bytes_.push_back(DownBytesAtMost(in.codec, uint32_t(in.islands), n,
                                            in.linear_outer_step));
    }
  }

  // An all-reduce of `bytes` between the islands: each sends and receives 2 (M - 1) / M of it,
  // 2 (M - 1) messages in sequence. Sparse payloads do not add up in place: they are all-gathered,
  // each island receiving the M - 1 others (M - 1 messages).
  double AllReduceSeconds(uint64_t bytes) const {
    const double m = in_.islands;
    if (in_.codec.sparse()) return (m - 1) * (Bits(bytes) / rate_ + in_.link.latency_s);
    return 2.0 * (m - 1) / m * Bits(bytes) / rate_ + 2.0 * (m - 1) * in_.link.latency_s;
  }

  void Step() {
    double stall = 0;
    if (in_.method == PlanMethod::kDataParallel) {
      // The gradients' all-reduce runs during the backward pass; what does not fit in it stalls.
      stall = std::max(0.0, AllReduceSeconds(bytes_[0]) - in_.backward_fraction * in_.step_time_s);
    }
    now_ += in_.step_time_s + stall;
    compute_ += in_.step_time_s;
  }

  // Sends fragment f's contribution; its update is merged after inner step `apply_at`.
  void Push(uint32_t f, int64_t apply_at) { PushTogether({{f, apply_at}}); }

  // Sends the contributions of several fragments at once (after the same inner step), each with
  // the step after which its update is merged. Through the star an island's pushes are streams of
  // one channel that share its link (processor sharing: each of n in flight gets 1 / n of it), so
  // a fragment arrives, and is committed, only once the smaller ones and as much of each larger
  // one are through; the updates come down in the order their commits end. On the ring every
  // fragment is its own all-reduce, one after the other.
  void PushTogether(const std::vector<std::pair<uint32_t, int64_t>>& jobs) {
    std::vector<double> ready(jobs.size());
    if (in_.topology == PlanTopology::kRing) {
      for (size_t i = 0; i < jobs.size(); ++i) {
        const double start =
            std::max(now_ - in_.backward_fraction * in_.step_time_s, link_up_free_);
        link_up_free_ = start + AllReduceSeconds(bytes_[jobs[i].first]);
        ready[i] = link_up_free_;
      }
    } else {
      const double latency = in_.link.latency_s;
      const double start = std::max(now_, link_up_free_);
      // The k-th shortest transfer of n, all started together, ends after the k - 1 shorter ones
      // and n - k + 1 times its own length.
      std::vector<size_t> order(jobs.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      auto up_s = [&](size_t i) { return Bits(bytes_[jobs[i].first]) / rate_; };
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return up_s(a) < up_s(b); });
      double done_before = 0;
      for (size_t k = 0; k < order.size(); ++k) {
        const size_t i = order[k];
        const double arrived =
            start + done_before + double(order.size() - k) * up_s(i) + latency;
        done_before += up_s(i);
        const uint32_t f = jobs[i].first;
        // Its shard commits one fragment at a time.
        double& shard_free = shard_free_[f % shard_free_.size()];
        const double committed =
            std::max(arrived, shard_free) + CommitSeconds(in_, in_.fragment_elements[f]);
        shard_free = committed;
        // The wait for the update is sent once the push is acknowledged: two more latencies.
        const double down_start = std::max({committed, arrived + 2 * latency, link_down_free_});
        link_down_free_ = down_start + Bits(down_bytes_[f]) / rate_;
        ready[i] = link_down_free_ + latency;
      }
      link_up_free_ = start + done_before;
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
      const uint64_t bytes = bytes_[jobs[i].first];
      in_flight_.push_back({jobs[i].second, ready[i], bytes});
      bytes_in_flight_ += bytes;
      peak_in_flight_ = std::max(peak_in_flight_, bytes_in_flight_);
    }
  }

  void LandDue(int64_t t) {
    while (!in_flight_.empty() && in_flight_.front().apply_at <= t) Land();
  }
  void LandAll() {
    while (!in_flight_.empty()) Land();
  }

  double now() const { return now_; }
  double compute() const { return compute_; }
  uint64_t peak_in_flight() const { return peak_in_flight_; }
  const std::vector<uint64_t>& bytes() const { return bytes_; }
  const std::vector<uint64_t>& down_bytes() const { return down_bytes_; }

 private:
  struct Job {
    int64_t apply_at;
    double ready;
    uint64_t bytes;
  };
  void Land() {
    const Job job = in_flight_.front();
    in_flight_.pop_front();
    Wait(job.ready);
    bytes_in_flight_ -= job.bytes;
  }
  void Wait(double until) { now_ = std::max(now_, until); }

  const PlanInput& in_;
  const double rate_;
  std::vector<uint64_t> bytes_;  // encoded, per fragment
  std::vector<uint64_t> down_bytes_;  // the outer update (star), per fragment
  double now_ = 0, compute_ = 0;
  double link_up_free_ = 0, link_down_free_ = 0;
  std::vector<double> shard_free_ = std::vector<double>(size_t(std::max(1, in_.shards)), 0.0);
  std::deque<Job> in_flight_;
  uint64_t bytes_in_flight_ = 0, peak_in_flight_ = 0;
};

}  // namespace

const char* PlanMethodName(PlanMethod method) {
  switch (method) {
    case PlanMethod::kDataParallel: return "data_parallel";
    case PlanMethod::kDiLoCo: return "diloco";
    case PlanMethod::kStreaming: return "streaming";
  }
  return "?";
}

absl::StatusOr<PlanMethod> ParsePlanMethod(const std::string& name) {
  for (auto m : {PlanMethod::kDataParallel, PlanMethod::kDiLoCo, PlanMethod::kStreaming}) {
    if (name == PlanMethodName(m)) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown method '", name, "' (data_parallel, diloco or streaming)"));
}

absl::StatusOr<PlanTopology> ParsePlanTopology(const std::string& name) {
  if (name == "star") return PlanTopology::kStar;
  if (name == "ring") return PlanTopology::kRing;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown topology '", name, "' (star: atoll's service; ring: the paper's all-reduce)"));
}

double LinkModel::RateBps() const {
  if (latency_s <= 0) return bandwidth_bps;
  return std::min(bandwidth_bps, connections * Bits(uint64_t(tcp_window_bytes)) / (2 * latency_s));
}

absl::Status ValidatePlanInput(const PlanInput& in) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (in.fragment_elements.empty()) return bad("the model has no parameters");
  for (uint64_t n : in.fragment_elements) {
    if (n == 0 || n > (uint64_t(1) << 44)) return bad("fragment of ", n, " parameters");
  }
  if (!(in.step_time_s > 0) || in.step_time_s > 1e5) {
    return bad("step time must be in (0, 1e5] s, got ", in.step_time_s);
  }
  if (in.islands < 1 || in.islands > 100000) return bad("islands must be in [1, 100000]");
  if (!(in.link.bandwidth_bps > 0) || !std::isfinite(in.link.bandwidth_bps)) {
    return bad("bandwidth must be positive");
  }
  if (!(in.link.latency_s >= 0) || in.link.latency_s > 60) return bad("latency must be in [0, 60] s");
  if (in.link.connections < 1 || in.link.connections > 1024) {
    return bad("connections must be in [1, 1024]");
  }
  if (!(in.link.tcp_window_bytes >= 1024) || in.link.tcp_window_bytes > 1e12) {
    return bad("TCP window must be in [1 KiB, 1 TB]");
  }
  if (in.sync_every < 1 || in.sync_every > 100000) return bad("H must be in [1, 100000]");
  const int p = int(in.fragment_elements.size());
  if (in.method != PlanMethod::kStreaming && p != 1) {
    return bad(PlanMethodName(in.method), " sends the whole model at once (1 fragment), got ", p);
  }
  if (p > in.sync_every) return bad("fragments (", p, ") must not exceed H (", in.sync_every, ")");
  if (in.tau < 0 || in.tau >= in.sync_every) {
    return bad("tau must be in [0, H = ", in.sync_every, "), got ", in.tau);
  }
  if (in.steps < 0 || in.steps > kMaxSteps) return bad("steps must be in [0, ", kMaxSteps, "]");
  if (!(in.backward_fraction >= 0 && in.backward_fraction <= 1)) {
    return bad("backward fraction must be in [0, 1]");
  }
  if (!(in.service_bandwidth_bps >= 0) || !std::isfinite(in.service_bandwidth_bps)) {
    return bad("service bandwidth must be positive (0: unlimited)");
  }
  if (!(in.commit_s_per_param >= 0) || in.commit_s_per_param > 1e-3) {
    return bad("commit time per parameter must be in [0, 1e-3] s");
  }
  if (in.service_threads < 1 || in.service_threads > 256) return bad("service threads must be in [1, 256]");
  if (in.shards < 1 || in.shards > 1024) return bad("shards must be in [1, 1024]");
  if (!(in.commit_parallel_fraction >= 0 && in.commit_parallel_fraction <= 1)) {
    return bad("commit parallel fraction must be in [0, 1]");
  }
  return absl::OkStatus();
}

PlanResult Simulate(const PlanInput& in) {
  Replay replay(in);
  const bool dp = in.method == PlanMethod::kDataParallel;
  const int h = dp ? 1 : in.sync_every;
  const bool finite = in.steps > 0;
  const SyncSchedule schedule(h, int(in.fragment_elements.size()),
                              finite && !dp ? in.phases : SyncPhases{});
  const int tau = in.method == PlanMethod::kStreaming ? in.tau : 0;
  const int64_t steps = finite ? in.steps : int64_t(kSteadyRounds) * h;
  const int64_t warmup = finite ? 0 : int64_t(kWarmupRounds) * h;
  double wall0 = 0, compute0 = 0;
  for (int64_t t = 1; t <= steps; ++t) {
    replay.Step();
    if (dp) continue;
    replay.LandDue(t);
    if (finite && t == steps) {
      // The run ends synced: what is in flight lands, then each fragment is pushed and merged.
      replay.LandAll();
      for (uint32_t f = 0; f < in.fragment_elements.size(); ++f) {
        replay.Push(f, t);
        replay.LandAll();
      }
      break;
    }
    std::vector<std::pair<uint32_t, int64_t>> due;
    for (uint32_t f : schedule.DueAfter(t)) {
      // As islands do: a fragment lands before its next push (the early phases' short rounds).
      due.emplace_back(f, t + std::min<int64_t>(tau, schedule.NextDue(int(f), t) - t - 1));
    }
    if (!due.empty()) replay.PushTogether(due);
    replay.LandDue(t);
    if (t == warmup) {
      wall0 = replay.now();
      compute0 = replay.compute();
    }
  }
  PlanResult r;
  r.steps = steps;
  r.compute_s = replay.compute() - compute0;
  r.wall_s = replay.now() - wall0;
  r.stall_s = r.wall_s - r.compute_s;
  r.utilization = r.compute_s / std::max(1e-300, r.wall_s);
  r.peak_bytes_in_flight = replay.peak_in_flight();
  const double m = in.islands;
  double sent = 0, received = 0;
  const bool all_reduce = dp || in.topology == PlanTopology::kRing;
  for (size_t f = 0; f < replay.bytes().size(); ++f) {
    const double b = double(replay.bytes()[f]);
    const double ring = in.codec.sparse() ? (m - 1) * b : 2.0 * (m - 1) / m * b;
    sent += all_reduce ? ring : b;
    received += all_reduce ? ring : double(replay.down_bytes()[f]);
  }
  r.bytes_sent_per_round = sent;
  r.bytes_received_per_round = received;
  const double round_wall_s = h * in.step_time_s / std::max(1e-12, r.utilization);
  r.bytes_per_hour = (sent + received) * 3600 / round_wall_s;
  return r;
}

absl::StatusOr<double> RequiredBandwidth(PlanInput in, double target) {
  if (!(target > 0 && target < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("target utilization must be in (0, 1), got ",
                                                   target));
  }
  in.link.bandwidth_bps = 1e15;
  ATL_RETURN_IF_ERROR(ValidatePlanInput(in));
  const double best = Simulate(in).utilization;
  if (best < target) {
    // What bounds it when bandwidth does not.
    std::vector<std::string> bounds;
    if (in.link.latency_s > 0) {
      bounds.push_back(absl::StrFormat(
          "%d TCP connection(s) carry %s (window / round trip), latency %.0f ms one way",
          in.link.connections, FormatBandwidth(in.link.RateBps()), 1e3 * in.link.latency_s));
    }
    if (in.topology == PlanTopology::kStar && in.method != PlanMethod::kDataParallel &&
        in.commit_s_per_param > 0) {
      uint64_t largest = 0;
      for (uint64_t n : in.fragment_elements) largest = std::max(largest, n);
      bounds.push_back(absl::StrFormat(
          "the service's commit takes %.2f s for the largest fragment (%d service thread(s), %d "
          "shard(s))",
          CommitSeconds(in, largest), in.service_threads, in.shards));
    }
    if (in.topology == PlanTopology::kStar && in.service_bandwidth_bps > 0) {
      bounds.push_back(absl::StrFormat("the service's link leaves each of the %d islands %s",
                                       in.islands,
                                       FormatBandwidth(in.service_bandwidth_bps / in.islands)));
    }
    return absl::OutOfRangeError(absl::StrFormat("%s reaches %.1f%% at most, at any bandwidth: %s",
                                                 PlanMethodName(in.method), 100 * best,
                                                 absl::StrJoin(bounds, "; ")));
  }
  double lo = std::log(1e3), hi = std::log(1e15);
  while (hi - lo > 1e-3) {  // 0.1%
    const double mid = (lo + hi) / 2;
    in.link.bandwidth_bps = std::exp(mid);
    (Simulate(in).utilization >= target ? hi : lo) = mid;
  }
  return std::exp(hi);
}

namespace {

// A number and a unit from `units` (lower case, longest first), scaled; empty unit: scale 1.
absl::StatusOr<double> ParseWithUnit(const std::string& text,
                                     const std::vector<std::pair<std::string, double>>& units,
                                     const char* what) {
  const std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const std::string unit(end);
  if (end == s.c_str() || !std::isfinite(v) || v < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", text, "' is not a number"));
  }
  for (const auto& [name, scale] : units) {
    if (unit == name) return v * scale;
  }
  std::string known;
  for (const auto& [name, scale] : units) {
    if (!name.empty()) absl::StrAppend(&known, known.empty() ? "" : ", ", name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " '", text, "': unknown unit '", unit, "' (", known, ")"));
}

}  // namespace

absl::StatusOr<double> ParseBandwidth(const std::string& text) {
  std::vector<std::pair<std::string, double>> units = {{"", 1}};
  for (auto [prefix, scale] : {std::pair{"", 1.0}, {"k", 1e3}, {"m", 1e6}, {"g", 1e9}, {"t", 1e12}}) {
    for (const char* suffix : {"bit", "bit/s", "bps", "b/s"}) {
      units.push_back({absl::StrCat(prefix, suffix), scale});
    }
  }
  auto v = ParseWithUnit(text, units, "bandwidth");
  if (v.ok() && !(*v > 0)) return absl::InvalidArgumentError("bandwidth must be positive");
  return v;
}

absl::StatusOr<double> ParseDuration(const std::string& text) {
  return ParseWithUnit(text, {{"", 1}, {"s", 1}, {"ms", 1e-3}, {"us", 1e-6}}, "duration");
}

std::string FormatBandwidth(double bps) {
  if (bps >= 1e12) return absl::StrFormat("%.1f Tbit/s", bps / 1e12);
  if (bps >= 1e9) return absl::StrFormat("%.1f Gbit/s", bps / 1e9);
  if (bps >= 1e6) return absl::StrFormat("%.1f Mbit/s", bps / 1e6);
  return absl::StrFormat("%.1f kbit/s", bps / 1e3);
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  return absl::StrFormat(u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
}

}  // namespace atl::outer
