#include "src/observe/monitoring.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include <nlohmann/json.hpp>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "absl/strings/str_cat.h"
#include "src/net/grpc_server.h"
#include "src/observe/metrics.h"

namespace atl {

namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using Clock = std::chrono::steady_clock;

// Buckets from `first` growing by `factor`, `n` of them.
Histogram::BucketBoundaries Exponential(double first, double factor, int n) {
  Histogram::BucketBoundaries b;
  for (int i = 0; i < n; ++i) b.push_back(first * std::pow(factor, i));
  return b;
}
const Histogram::BucketBoundaries kStalenessBuckets = {0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32};

// A counter that follows a cumulative figure read elsewhere (it only ever grows by the difference).
void Follow(Counter& c, double total) {
  if (total > c.Value()) c.Increment(total - c.Value());
}

// A curve of (x, y) points, at most kMax of them: when full, every other point is dropped, so it
// always spans the whole run at a coarser and coarser step.
class Curve {
 public:
  static constexpr size_t kMax = 512;
  void Add(double x, double y) {
    if (!points_.empty() && points_.back()[0] == x) {
      points_.back()[1] = y;
      return;
    }
    if (points_.size() >= kMax) {
      std::vector<std::array<double, 2>> kept;
      for (size_t i = 0; i < points_.size(); i += 2) kept.push_back(points_[i]);
      points_ = std::move(kept);
    }
    points_.push_back({x, y});
  }
  nlohmann::json Json() const {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& p : points_) j.push_back({p[0], p[1]});
    return j;
  }

 private:
  std::vector<std::array<double, 2>> points_;
};

std::string Serialize(const prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The coordinator.

struct ServiceMonitor::State {
  State(const outer::SyncServer& s, const TrafficCounters* t, RunFacts f)
      : sync(s), traffic(t), facts(std::move(f)), start(Clock::now()) {}

  const outer::SyncServer& sync;
  const TrafficCounters* traffic;
  const RunFacts facts;
  const Clock::time_point start;
  double offset_s = 0;  // a resumed service's clock starts where its last round was logged
  double Wall() const {
    return offset_s + std::chrono::duration<double>(Clock::now() - start).count();
  }

  prometheus::Registry registry;
  Family<Gauge>& Gauges(const char* name, const char* help) {
    return BuildGauge().Name(name).Help(help).Register(registry);
  }
  Family<Counter>& rounds = BuildCounter()
                                .Name("atoll_rounds_committed_total")
                                .Help("Outer rounds (async: versions) committed, by fragment")
                                .Register(registry);
  Histogram& round_seconds =
      BuildHistogram()
          .Name("atoll_round_duration_seconds")
          .Help("From a round's first contribution to its commit")
          .Register(registry)
          .Add({}, Exponential(0.05, 2, 14));
  Histogram& commit_seconds =
      BuildHistogram()
          .Name("atoll_commit_duration_seconds")
          .Help("A commit's data work: aggregation, outer step, encoding, hashing")
          .Register(registry)
          .Add({}, Exponential(0.001, 2.5, 14));
  Histogram& contributors =
      BuildHistogram()
          .Name("atoll_round_contributors")
          .Help("Islands whose contributions a round combined")
          .Register(registry)
          .Add({}, Histogram::BucketBoundaries{1, 2, 3, 4, 6, 8, 12, 16, 32, 64});
  Histogram& staleness = BuildHistogram()
                             .Name("atoll_contribution_staleness")
                             .Help("Async: versions between a contribution's base and its arrival")
                             .Register(registry)
                             .Add({}, kStalenessBuckets);
  Counter& tokens = BuildCounter()
                        .Name("atoll_tokens_committed_total")
                        .Help("Tokens weighed by committed contributions (fragment 0)")
                        .Register(registry)
                        .Add({});
  Family<Gauge>& members = Gauges(
      "atoll_islands", "Islands by membership state (members, and former members by how they ended)");
  Counter& lease_expiries = BuildCounter()
                                .Name("atoll_lease_expiries_total")
                                .Help("Members dropped after a lease of silence")
                                .Register(registry)
                                .Add({});
  // The token ledger's account of each island (outer/service/token_ledger.h), fragment 0.
  Family<Counter>& island_tokens =
      BuildCounter()
          .Name("atoll_island_tokens_total")
          .Help("An island's tokens by where they went: trained (recomputed ones included), "
                "committed on_time, committed stale (late), recomputed after a restart")
          .Register(registry);
  Family<Counter>& island_refused = BuildCounter()
                                        .Name("atoll_island_tokens_refused_total")
                                        .Help("An island's tokens in refused contributions, by reason")
                                        .Register(registry);
  Family<Counter>& bytes = BuildCounter()
                               .Name("atoll_service_bytes_total")
                               .Help("Outer-sync bytes the service moved, by island and direction")
                               .Register(registry);
  // Each member's latest heartbeat telemetry.
  Family<Gauge>& island_loss = Gauges("atoll_island_inner_loss", "Inner loss of its latest step");
  Family<Gauge>& island_val_loss =
      Gauges("atoll_island_validation_loss", "Validation loss of its latest evaluation");
  Family<Gauge>& island_tokens_per_s =
      Gauges("atoll_island_tokens_per_second", "Its training throughput");
  Family<Gauge>& island_utilization =
      Gauges("atoll_island_compute_utilization", "Its compute time over its wall time");
  Family<Gauge>& island_step = Gauges("atoll_island_inner_step", "Its latest inner step");
  Family<Gauge>& island_flagged = Gauges(
      "atoll_island_flagged_claims", "Its contributions that claimed more tokens than its throughput allows");
  // What the aggregation said of its contributions (outer/base/aggregation.h, copies.h).
  Family<Counter>& island_flags =
      BuildCounter()
          .Name("atoll_island_flagged_rounds_total")
          .Help("Committed rounds that flagged the island's contribution, by reason: copy (it "
                "weighed as one with another's), outlier (a robust rule dropped it far more "
                "often than chance), clipped (clipped_mean bounded its norm), excluded or "
                "down_weighted (outer.scoring: its reputation left it out or lowered its "
                "weight), harmful (outer.scoring: the round found it harmful and left it out)")
          .Register(registry);

  Family<Gauge>& island_reputation = Gauges(
      "atoll_island_reputation",
      "outer.scoring: its reputation from the held-out loss its contributions buy (1: new)");

  std::mutex mu;  // what follows
  struct Island {
    Curve loss, val_loss, bandwidth_in, bandwidth_out;
    int64_t last_step = -1;
    double last_val = 0;
    uint64_t contributions = 0;
    double last_contribution_s = -1;  // wall time of the commit that last took it
    uint64_t last_round = 0, last_fragment = 0, last_staleness = 0;
    std::map<std::string, uint64_t> flags;  // rounds that flagged its contribution, by reason
    double reputation = -1;                  // outer.scoring (-1: not scored)
    double weight = 1;                       // its weight in its latest scored round
    TrafficCounters::Bytes traffic;  // as of the last sample
    double traffic_at = 0;
    double in_bps = 0, out_bps = 0;
  };
  std::map<std::string, Island> islands;  // every island seen (bounded by membership's bounds)
  struct Round {
    uint64_t round;
    uint32_t fragment;
    double wall_s, round_s, commit_s;
    std::vector<std::string> contributors;
    uint64_t tokens, staleness;
  };
  std::deque<Round> recent;  // newest last
  static constexpr size_t kRecentRounds = 400;
  outer::SyncServer::Status status;
  double last_sample = -1;
};

ServiceMonitor::ServiceMonitor(const outer::SyncServer& sync, const TrafficCounters* traffic,
                               RunFacts facts)
    : state_(std::make_unique<State>(sync, traffic, std::move(facts))) {}
ServiceMonitor::~ServiceMonitor() = default;

void ServiceMonitor::OnCommit(const outer::CommittedRound& r) {
  State& s = *state_;
  s.rounds.Add({{"fragment", absl::StrCat(r.fragment)}}).Increment();
  if (r.round_s > 0) s.round_seconds.Observe(r.round_s);
  s.commit_seconds.Observe(r.commit_s);
  s.contributors.Observe(double(r.contributors.size()));
  if (s.facts.async) s.staleness.Observe(double(r.staleness));
  if (r.fragment == 0) s.tokens.Increment(double(r.tokens));
  std::lock_guard<std::mutex> lock(s.mu);
  const double wall = s.Wall();
  // The islands shown (bounded): contributors, and those the round scored (a harmful one is left
  // out of every round it lands in, and shown all the same).
  auto island = [&s](const std::string& id) -> State::Island* {
    auto it = s.islands.find(id);
    if (it == s.islands.end()) {
      if (s.islands.size() >= TrafficCounters::kMaxIslands) return nullptr;
      it = s.islands.emplace(id, State::Island{}).first;
    }
    return &it->second;
  };
  for (const auto& id : r.contributors) {
    State::Island* known = island(id);
    if (known == nullptr) continue;
    State::Island& i = *known;
    i.contributions += 1;
    i.last_contribution_s = wall;
    i.last_round = r.round;
    i.last_fragment = r.fragment;
    i.last_staleness = r.staleness;
  }
  auto flag = [&s](const std::string& id, const char* reason) {  // islands seen (bounded) only
    auto it = s.islands.find(id);
    if (it == s.islands.end()) return;
    it->second.flags[reason] += 1;
    s.island_flags.Add({{"island", id}, {"reason", reason}}).Increment();
  };
  for (const auto& group : r.aggregation.copies.groups) {
    for (const auto& id : group) flag(id, "copy");
  }
  for (const auto& [id, score] : r.aggregation.scores.islands) {
    State::Island* scored = island(id);
    if (scored == nullptr) continue;
    if (score.excluded && score.harmful) {
      flag(id, "harmful");
    } else if (score.excluded) {
      flag(id, "excluded");
    } else if (score.weight < 1) {
      flag(id, "down_weighted");
    }
    scored->reputation = score.reputation;
    scored->weight = score.excluded ? 0 : score.weight;
    s.island_reputation.Add({{"island", id}}).Set(score.reputation);
  }
  for (const auto& id : r.aggregation.outliers) flag(id, "outlier");
  for (const auto& id : r.aggregation.clipped) flag(id, "clipped");
  s.recent.push_back({r.round, r.fragment, wall, r.round_s, r.commit_s, r.contributors, r.tokens,
                      r.staleness});
  while (s.recent.size() > State::kRecentRounds) s.recent.pop_front();
}

void ServiceMonitor::Sample() {
  State& s = *state_;
  outer::SyncServer::Status status = s.sync.GetStatus();
  const auto traffic = s.traffic ? s.traffic->Snapshot() : std::map<std::string, TrafficCounters::Bytes>{};
  std::lock_guard<std::mutex> lock(s.mu);
  const double wall = s.Wall();
  std::map<std::string, int> by_state = {{"joining", 0}, {"active", 0}, {"leaving", 0},
                                         {"dead", 0}};
  for (const auto& i : status.islands) by_state[i.state] += 1;
  for (const auto& [state, n] : by_state) s.members.Add({{"state", state}}).Set(n);
  Follow(s.lease_expiries, double(status.lease_expiries));
  for (const auto& i : status.islands) {
    auto it = s.islands.find(i.island_id);
    if (it == s.islands.end()) {
      if (s.islands.size() >= TrafficCounters::kMaxIslands) continue;
      it = s.islands.emplace(i.island_id, State::Island{}).first;
    }
    State::Island& mine = it->second;
    const prometheus::Labels labels = {{"island", i.island_id}};
    // The island's token account, as counters following the ledger's totals.
    const outer::TokenAccount& a = i.tokens;
    for (const auto& [kind, n] : {std::pair<const char*, uint64_t>{"trained", a.trained},
                                  {"on_time", a.on_time},
                                  {"stale", a.stale},
                                  {"recomputed", a.recomputed}}) {
      Follow(s.island_tokens.Add({{"island", i.island_id}, {"kind", kind}}), double(n));
    }
    for (const auto& [reason, n] : a.refused) {
      Follow(s.island_refused.Add({{"island", i.island_id}, {"reason", reason}}), double(n));
    }
    if (!i.member) {
      // A former member: its gauges go (its counters and curves stay).
      for (auto* f : {&s.island_loss, &s.island_val_loss, &s.island_tokens_per_s,
                      &s.island_utilization, &s.island_step, &s.island_flagged}) {
        if (f->Has(labels)) f->Remove(&f->Add(labels));
      }
      continue;
    }
    const auto& t = i.telemetry;
    s.island_step.Add(labels).Set(double(i.inner_step));
    s.island_tokens_per_s.Add(labels).Set(t.tokens_per_s());
    s.island_utilization.Add(labels).Set(t.utilization());
    s.island_flagged.Add(labels).Set(double(i.flagged_claims));
    if (int64_t(i.inner_step) != mine.last_step && t.tokens() > 0) {
      s.island_loss.Add(labels).Set(t.loss());
      mine.loss.Add(double(i.inner_step), t.loss());
      mine.last_step = int64_t(i.inner_step);
    }
    if (t.val_loss() > 0) {
      s.island_val_loss.Add(labels).Set(t.val_loss());
      if (t.val_loss() != mine.last_val) mine.val_loss.Add(double(i.inner_step), t.val_loss());
      mine.last_val = t.val_loss();
    }
  }
  for (const auto& [id, bytes] : traffic) {
    Follow(s.bytes.Add({{"island", id}, {"direction", "received"}}), double(bytes.received));
    Follow(s.bytes.Add({{"island", id}, {"direction", "sent"}}), double(bytes.sent));
    auto it = s.islands.find(id);
    if (it == s.islands.end()) continue;
    State::Island& i = it->second;
    const double dt = wall - i.traffic_at;
    if (i.traffic_at > 0 && dt > 0.2) {
      i.in_bps = 8.0 * double(bytes.received - i.traffic.received) / dt;
      i.out_bps = 8.0 * double(bytes.sent - i.traffic.sent) / dt;
      i.bandwidth_in.Add(wall, i.in_bps);
      i.bandwidth_out.Add(wall, i.out_bps);
    }
    if (i.traffic_at == 0 || dt > 0.2) {
      i.traffic = bytes;
      i.traffic_at = wall;
    }
  }
  s.status = std::move(status);
  s.last_sample = wall;
}

std::string ServiceMonitor::PrometheusText() {
  Sample();
  return Serialize(state_->registry);
}

std::string ServiceMonitor::StatusJson() {
  Sample();
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  const auto& st = s.status;
  nlohmann::json j = {{"run_id", s.facts.run_id},
                      {"mode", s.facts.async ? "async" : "sync"},
                      {"islands_expected", s.facts.islands},
                      {"sync_every", s.facts.sync_every},
                      {"fragments", s.facts.fragments},
                      {"total_rounds", s.facts.total_rounds},
                      {"total_steps", s.facts.total_steps},
                      {"committed_rounds", st.committed_rounds},
                      {"rounds", st.rounds},
                      {"membership_epoch", st.membership_epoch},
                      {"lease_expiries", st.lease_expiries},
                      {"wall_s", s.last_sample}};
  nlohmann::json islands = nlohmann::json::array();
  for (const auto& i : st.islands) {
    const auto it = s.islands.find(i.island_id);
    const State::Island empty;
    const State::Island& mine = it == s.islands.end() ? empty : it->second;
    const auto& t = i.telemetry;
    nlohmann::json row = {{"id", i.island_id},
                          {"state", i.state},
                          {"member", i.member},
                          {"finished", i.finished},
                          {"data_stream", i.data_stream},
                          {"data_parallel", i.data_parallel},
                          {"flagged_claims", i.flagged_claims},
                          {"step", i.inner_step},
                          {"silent_s", i.silent_s},
                          {"loss", t.loss()},
                          {"val_loss", t.val_loss()},
                          {"val_bpb", t.val_bpb()},
                          {"tokens", t.tokens()},
                          {"tokens_per_s", t.tokens_per_s()},
                          {"utilization", t.utilization()},
                          {"bytes_sent", t.bytes_sent()},
                          {"bytes_received", t.bytes_received()},
                          // Per parameter and round each way (0: no round yet).
                          {"bits_up", BitsPerParam(t.bytes_sent(), t.elements_synced())},
                          {"bits_down", BitsPerParam(t.bytes_received(), t.elements_synced())},
                          {"service_bytes_received", mine.traffic.received},
                          {"service_bytes_sent", mine.traffic.sent},
                          {"in_bps", mine.in_bps},
                          {"out_bps", mine.out_bps},
                          {"contributions", mine.contributions},
                          {"flagged_rounds", mine.flags},
                          {"reputation", mine.reputation},
                          {"weight", mine.weight},
                          {"token_account", TokenAccountJson(i.tokens)},
                          {"staleness", mine.last_staleness},
                          {"loss_curve", mine.loss.Json()},
                          {"val_loss_curve", mine.val_loss.Json()},
                          {"bandwidth_in", mine.bandwidth_in.Json()},
                          {"bandwidth_out", mine.bandwidth_out.Json()}};
    if (mine.last_contribution_s >= 0) {
      row["last_contribution"] = {{"round", mine.last_round},
                                  {"fragment", mine.last_fragment},
                                  {"wall_s", mine.last_contribution_s}};
    }
    islands.push_back(std::move(row));
  }
  j["islands"] = std::move(islands);
  nlohmann::json rounds = nlohmann::json::array();
  for (const auto& r : s.recent) {
    rounds.push_back({{"round", r.round},
                      {"fragment", r.fragment},
                      {"wall_s", r.wall_s},
                      {"round_s", r.round_s},
                      {"commit_s", r.commit_s},
                      {"contributors", r.contributors},
                      {"tokens", r.tokens},
                      {"staleness", r.staleness}});
  }
  j["timeline"] = std::move(rounds);
  return j.dump();
}

void ServiceMonitor::Resume(const std::vector<std::string>& records) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  const size_t first = records.size() > State::kRecentRounds ? records.size() - State::kRecentRounds : 0;
  for (size_t i = first; i < records.size(); ++i) {
    const auto j = nlohmann::json::parse(records[i], nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    std::vector<std::string> contributors;
    if (j.contains("contributors") && j["contributors"].is_array()) {
      for (const auto& c : j["contributors"]) {
        if (c.is_string()) contributors.push_back(c.get<std::string>());
      }
    }
    s.recent.push_back({j.value("round", uint64_t(0)), j.value("fragment", 0u),
                        j.value("wall_s", 0.0), j.value("round_s", 0.0), j.value("commit_s", 0.0),
                        std::move(contributors), j.value("tokens", uint64_t(0)),
                        j.value("staleness", uint64_t(0))});
  }
  if (!s.recent.empty()) s.offset_s = std::max(s.offset_s, s.recent.back().wall_s);
}

// ---------------------------------------------------------------------------------------------
// An island process.

struct IslandMonitor::State {
  State(const std::string& island, int rank, bool async)
      : labels{{"island", island}, {"rank", absl::StrCat(rank)}}, async(async) {}
  const prometheus::Labels labels;
  const bool async;
  prometheus::Registry registry;

  Gauge& Make(const char* name, const char* help) {
    return BuildGauge().Name(name).Help(help).Labels(labels).Register(registry).Add({});
  }
  Counter& MakeCounter(const char* name, const char* help) {
    return BuildCounter().Name(name).Help(help).Labels(labels).Register(registry).Add({});
  }
  Histogram& MakeHistogram(const char* name, const char* help, Histogram::BucketBoundaries b) {
    return BuildHistogram().Name(name).Help(help).Labels(labels).Register(registry).Add({}, std::move(b));
  }

  Counter& steps = MakeCounter("atoll_inner_steps_total", "Inner steps this process trained");
  Gauge& tokens = Make("atoll_tokens", "Tokens the island has trained on (its step counter's)");
  Gauge& loss = Make("atoll_inner_loss", "Inner loss of the latest step");
  // Absent until the first evaluation (a 0 would read as a loss).
  Family<Gauge>& val_loss = BuildGauge()
                                .Name("atoll_validation_loss")
                                .Help("Validation loss of the latest evaluation")
                                .Register(registry);
  Gauge& tokens_per_s = Make("atoll_tokens_per_second",
                             "Tokens per second of wall time, over the last 10 s or so");
  Counter& compute = MakeCounter("atoll_compute_seconds_total", "Time spent in inner steps");
  Counter& idle = MakeCounter("atoll_idle_seconds_total",
                              "Time the training thread waited for outer updates");
  Gauge& utilization = Make("atoll_compute_utilization", "Compute time over wall time, since start");
  Counter& rounds = MakeCounter("atoll_outer_rounds_total", "Outer rounds merged");
  Counter& resyncs = MakeCounter("atoll_outer_resyncs_total",
                                 "Rounds that ended in a full fetch of the global parameters");
  Family<Counter>& bytes = BuildCounter()
                               .Name("atoll_outer_bytes_total")
                               .Help("Outer-sync payload bytes, by direction")
                               .Labels(labels)
                               .Register(registry);
  Counter& sent = bytes.Add({{"direction", "sent"}});
  Counter& received = bytes.Add({{"direction", "received"}});
  Gauge& goodput = Make("atoll_outer_goodput_bytes_per_second",
                        "Payload bytes of the latest round over the time spent pushing and receiving");
  Histogram& push_s = MakeHistogram("atoll_outer_push_seconds", "Encoding and pushing a fragment",
                                    Exponential(0.001, 2.5, 14));
  Histogram& wait_s = MakeHistogram("atoll_outer_wait_seconds",
                                    "Waiting for a round to commit and receiving its update",
                                    Exponential(0.001, 2.5, 14));
  Family<Gauge>& error = BuildGauge()
                             .Name("atoll_quantization_error")
                             .Help("Relative RMS error of the latest pushed encoding of a fragment "
                                   "against its exact pseudo-gradient (sampled)")
                             .Labels(labels)
                             .Register(registry);
  Histogram& staleness = MakeHistogram(
      "atoll_outer_staleness", "Async: versions between a contribution's base and its arrival",
      kStalenessBuckets);
  Histogram& ckpt_stall = MakeHistogram("atoll_checkpoint_stall_seconds",
                                        "Pause of training to snapshot a checkpoint",
                                        Exponential(0.0005, 2.5, 12));
  Histogram& ckpt_write = MakeHistogram("atoll_checkpoint_write_seconds",
                                        "Writing a checkpoint (in the background)",
                                        Exponential(0.005, 2.5, 12));

  std::mutex mu;  // the throughput window
  std::deque<std::pair<double, int64_t>> window;  // (wall_s, tokens), the last ~10 s
  double compute_s = 0;
};

IslandMonitor::IslandMonitor(const std::string& island, int rank, bool async)
    : state_(std::make_unique<State>(island, rank, async)) {}
IslandMonitor::~IslandMonitor() = default;

void IslandMonitor::OnSteps(int64_t steps, double loss, int64_t tokens, double compute_s,
                            double wall_s) {
  State& s = *state_;
  s.steps.Increment(double(steps));
  s.tokens.Set(double(tokens));
  if (std::isfinite(loss)) s.loss.Set(loss);
  std::lock_guard<std::mutex> lock(s.mu);
  Follow(s.compute, compute_s);
  s.utilization.Set(wall_s > 0 ? std::min(1.0, compute_s / wall_s) : 0.0);
  s.window.emplace_back(wall_s, tokens);
  while (s.window.size() > 2 && s.window.front().first < wall_s - 10) s.window.pop_front();
  const auto& [w0, t0] = s.window.front();
  if (wall_s > w0) s.tokens_per_s.Set(double(tokens - t0) / (wall_s - w0));
}

void IslandMonitor::OnEval(double val_loss) { state_->val_loss.Add(state_->labels).Set(val_loss); }

void IslandMonitor::OnRound(uint32_t fragment, const outer::RoundOutcome& o, double idle_s) {
  State& s = *state_;
  s.rounds.Increment();
  if (o.resynced) s.resyncs.Increment();
  s.sent.Increment(double(o.bytes_sent));
  s.received.Increment(double(o.bytes_received));
  if (idle_s > 0) s.idle.Increment(idle_s);
  s.push_s.Observe(o.push_s);
  s.wait_s.Observe(o.wait_s);
  const double busy = o.push_s + o.wait_s;
  if (busy > 0) s.goodput.Set(double(o.bytes_sent + o.bytes_received) / busy);
  s.error.Add({{"fragment", absl::StrCat(fragment)}}).Set(o.quantization_error);
  if (s.async) s.staleness.Observe(double(o.staleness));
}

double IslandMonitor::tokens_per_s() const { return state_->tokens_per_s.Value(); }

void IslandMonitor::OnCheckpointStall(double seconds) { state_->ckpt_stall.Observe(seconds); }
void IslandMonitor::OnCheckpointWritten(double seconds) { state_->ckpt_write.Observe(seconds); }

std::string IslandMonitor::PrometheusText() { return Serialize(state_->registry); }

}  // namespace atl
