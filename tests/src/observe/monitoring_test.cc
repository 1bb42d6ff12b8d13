// Live monitoring: the HTTP server, the Prometheus exposition (checked against the text format's
// rules, by Debian's promtool, and scraped by a real Prometheus), the status page in a real
// headless Chromium, and the heartbeat telemetry behind it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <httplib.h>

#include <chrono>
#include <cmath>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "outer/service/sync_server.h"
#include "src/net/grpc_server.h"
#include "src/net/http_server.h"
#include "src/observe/monitoring.h"
#include "tests/test_util.h"

namespace atl {
namespace {

namespace pb = ::atollpb::v1;

using ::testing::HasSubstr;
using ::testing::Not;

// ---------------------------------------------------------------------------------------------
// The Prometheus text format (version 0.0.4), as its documentation states it: what a scrape of ours
// must satisfy. Returns the families by name; ADD_FAILURE()s name each violation.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
struct MetricFamily {
  std::string type = "untyped";
  std::vector<Sample> samples;
};

bool ParseValue(const std::string& s, double* v) {
  if (s == "+Inf") return *v = INFINITY, true;
  if (s == "-Inf") return *v = -INFINITY, true;
  if (s == "NaN") return *v = NAN, true;
  return absl::SimpleAtod(s, v);
}

// The family a sample belongs to: histogram samples carry _bucket / _sum / _count.
std::string FamilyOf(const std::string& sample, const std::map<std::string, MetricFamily>& families) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    if (absl::EndsWith(sample, suffix)) {
      const std::string base = sample.substr(0, sample.size() - std::strlen(suffix));
      auto it = families.find(base);
      if (it != families.end() && (it->second.type == "histogram" || it->second.type == "summary")) {
        return base;
      }
    }
  }
  return sample;
}

void ParseInto(const std::string& text, std::map<std::string, MetricFamily>& families) {
  static const std::regex kName("[a-zA-Z_:][a-zA-Z0-9_:]*");
  static const std::regex kLabel("([a-zA-Z_][a-zA-Z0-9_]*)=\"((?:[^\"\\\\\\n]|\\\\[\\\\\"n])*)\",?");
  std::set<std::string> closed;  // families whose samples have ended: they may not come back
  std::string current;
  for (const auto& line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::string l(line);
    if (absl::StartsWith(l, "# TYPE ") || absl::StartsWith(l, "# HELP ")) {
      std::vector<std::string> parts = absl::StrSplit(l, absl::MaxSplits(' ', 3));
      ASSERT_GE(parts.size(), 3u) << l;
      EXPECT_TRUE(std::regex_match(parts[2], kName)) << l;
      if (parts[1] == "TYPE") {
        ASSERT_EQ(parts.size(), 4u) << l;
        EXPECT_THAT((std::set<std::string>{"counter", "gauge", "histogram", "summary", "untyped"}),
                    ::testing::Contains(parts[3])) << l;
        EXPECT_EQ(families.count(parts[2]), 0u) << "TYPE after samples or twice: " << l;
        families[parts[2]].type = parts[3];
      }
      continue;
    }
    if (absl::StartsWith(l, "#")) continue;
    Sample s;
    size_t at = l.find_first_of("{ ");
    ASSERT_NE(at, std::string::npos) << l;
    s.name = l.substr(0, at);
    EXPECT_TRUE(std::regex_match(s.name, kName)) << l;
    if (l[at] == '{') {
      const size_t end = l.find("} ", at);
      ASSERT_NE(end, std::string::npos) << l;
      std::string labels = l.substr(at + 1, end - at - 1);
      std::smatch m;
      while (!labels.empty()) {
        ASSERT_TRUE(std::regex_search(labels, m, kLabel) && m.position(0) == 0) << "labels: " << l;
        EXPECT_EQ(s.labels.count(m[1]), 0u) << "label twice: " << l;
        s.labels[m[1]] = m[2];
        labels = m.suffix();
      }
      at = end + 1;
    }
    std::vector<std::string> rest = absl::StrSplit(l.substr(at + 1), ' ');
    ASSERT_GE(rest.size(), 1u) << l;
    ASSERT_LE(rest.size(), 2u) << l;
    EXPECT_TRUE(ParseValue(rest[0], &s.value)) << "value: " << l;
    const std::string family = FamilyOf(s.name, families);
    if (family != current) {
      if (!current.empty()) closed.insert(current);
      EXPECT_EQ(closed.count(family), 0u) << "samples of " << family << " not together";
      current = family;
    }
    families[family].samples.push_back(std::move(s));
  }
}

std::map<std::string, MetricFamily> ParseExposition(const std::string& text) {
  std::map<std::string, MetricFamily> families;
  ParseInto(text, families);
  return families;
}

// Conventions on top of the format: atoll_ names, counters end in _total and never go negative,
// histograms have cumulative buckets ending at +Inf that match _count.
void CheckConventions(const std::map<std::string, MetricFamily>& families) {
  for (const auto& [name, f] : families) {
    EXPECT_TRUE(absl::StartsWith(name, "atoll_")) << name;
    EXPECT_NE(f.type, "untyped") << name << " has no TYPE";
    if (f.type == "counter") {
      EXPECT_TRUE(absl::EndsWith(name, "_total")) << name;
      for (const auto& s : f.samples) EXPECT_GE(s.value, 0) << name;
    } else {
      EXPECT_FALSE(absl::EndsWith(name, "_total")) << name << " is a " << f.type;
    }
    if (f.type != "histogram") continue;
    // Per label set (without le): buckets ascending in le and in count, +Inf last = _count.
    std::map<std::map<std::string, std::string>, std::vector<std::pair<double, double>>> buckets;
    std::map<std::map<std::string, std::string>, double> counts;
    for (const auto& s : f.samples) {
      auto labels = s.labels;
      if (s.name == name + "_bucket") {
        double le = 0;
        ASSERT_TRUE(labels.count("le") && ParseValue(labels["le"], &le)) << name;
        labels.erase("le");
        buckets[labels].push_back({le, s.value});
      } else if (s.name == name + "_count") {
        counts[labels] = s.value;
      } else {
        EXPECT_EQ(s.name, name + "_sum");
      }
    }
    for (const auto& [labels, b] : buckets) {
      ASSERT_FALSE(b.empty());
      for (size_t i = 1; i < b.size(); ++i) {
        EXPECT_LT(b[i - 1].first, b[i].first) << name;
        EXPECT_LE(b[i - 1].second, b[i].second) << name;
      }
      EXPECT_TRUE(std::isinf(b.back().first)) << name << ": no +Inf bucket";
      EXPECT_EQ(b.back().second, counts[labels]) << name;
    }
  }
}

// One value of a family: the sample named `sample` whose labels include `labels`.
double Value(const std::map<std::string, MetricFamily>& families, const std::string& family,
             const std::string& sample, const std::map<std::string, std::string>& labels = {}) {
  auto it = families.find(family);
  if (it == families.end()) return NAN;
  for (const auto& s : it->second.samples) {
    if (s.name != sample) continue;
    bool match = true;
    for (const auto& [k, v] : labels) match = match && s.labels.count(k) && s.labels.at(k) == v;
    if (match) return s.value;
  }
  return NAN;
}

// The path of an installed tool ("" if it is not).
std::string Which(const char* tool) {
  const auto r = testing::RunCommand(absl::StrCat("command -v ", tool));
  return r.exit_code == 0 ? std::string(absl::StripTrailingAsciiWhitespace(r.output)) : "";
}
bool Have(const char* tool) { return !Which(tool).empty(); }

// Debian's promtool lints an exposition by the official rules: nothing to say is a pass.
void Promtool(const testing::TempDir& dir, const std::string& text) {
  if (!Have("promtool")) return;
  testing::WriteFile(dir.Join("scrape.txt"), text);
  const auto lint = testing::RunCommand("promtool check metrics < " + dir.Join("scrape.txt") + " 2>&1");
  EXPECT_EQ(lint.exit_code, 0) << lint.output;
  EXPECT_EQ(lint.output, "") << lint.output;
}

std::string Get(const std::string& address, const std::string& path, int* status = nullptr) {
  httplib::Client client("http://" + address);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  auto r = client.Get(path.c_str());
  if (!r) return "";
  if (status != nullptr) *status = r->status;
  return r->body;
}

// ---------------------------------------------------------------------------------------------

TEST(HttpServerTest, ServesItsRoutesAndRefusesTheRest) {
  int calls = 0;
  auto server = HttpServer::Start("127.0.0.1:0", {{"/hello", [&calls] {
                                     ++calls;
                                     return HttpResponse{200, "text/plain", "hi"};
                                   }}});
  ASSERT_TRUE(server.ok()) << server.status();
  int status = 0;
  EXPECT_EQ(Get((*server)->address(), "/hello", &status), "hi");
  EXPECT_EQ(status, 200);
  Get((*server)->address(), "/nothing", &status);
  EXPECT_EQ(status, 404);
  httplib::Client client("http://" + (*server)->address());
  auto posted = client.Post("/hello", std::string(1 << 20, 'x'), "text/plain");
  ASSERT_TRUE(posted);
  EXPECT_GE(posted->status, 400);  // GET only; a body is not read past 64 KiB
  EXPECT_EQ(calls, 1);
}

// --http-token-file: every path but the probes needs the token, in a header or the query string
// (what a browser opening the status page can give); a refused request never reaches its handler.
TEST(HttpServerTest, ATokenGuardsEveryPathButTheProbes) {
  int calls = 0;
  auto server = HttpServer::Start(
      "127.0.0.1:0",
      {{"/api/status",
        [&calls] {
          ++calls;
          return HttpResponse{200, "application/json", "{}"};
        }},
       {"/healthz", [] { return HttpResponse{200, "text/plain", "ok\n"}; }}},
      HttpAccess{"s3cret", {"/healthz"}});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  int status = 0;
  EXPECT_THAT(Get(address, "/api/status", &status), HasSubstr("--http-token-file"));
  EXPECT_EQ(status, 401);
  Get(address, "/api/status?token=wrong", &status);
  EXPECT_EQ(status, 401);
  EXPECT_EQ(Get(address, "/api/status?token=s3cret", &status), "{}");
  EXPECT_EQ(status, 200);
  httplib::Client client("http://" + address);
  auto wrong = client.Get("/api/status", httplib::Headers{{"Authorization", "Bearer s3cre"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto right = client.Get("/api/status", httplib::Headers{{"Authorization", "Bearer s3cret"}});
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200);
  EXPECT_EQ(Get(address, "/healthz", &status), "ok\n");
  EXPECT_EQ(status, 200);
  EXPECT_EQ(calls, 2);
}

TEST(HttpServerTest, BadAddressesAreNamed) {
  auto bad = HttpServer::Start("localhost", {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("HOST:PORT"));
  auto first = HttpServer::Start("127.0.0.1:0", {});
  ASSERT_TRUE(first.ok());
  auto taken = HttpServer::Start((*first)->address(), {});
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(taken.status().message()), HasSubstr("in use"));
  EXPECT_EQ(*OffsetAddress("127.0.0.1:9100", 2), "127.0.0.1:9102");
  EXPECT_EQ(*OffsetAddress("127.0.0.1:0", 2), "127.0.0.1:0");
  EXPECT_FALSE(OffsetAddress("127.0.0.1:65535", 1).ok());
}

// ---------------------------------------------------------------------------------------------
// The service's side, in process: two islands join, heartbeat with telemetry, contribute.

outer::SyncServerOptions TwoIslands() {
  outer::SyncServerOptions o;
  o.run_id = "mon";
  o.num_data_streams = 2;
  o.sync_every = 4;
  o.total_inner_steps = 40;
  return o;
}

pb::JoinResponse Join(outer::SyncServer& sync, const std::string& name, uint32_t ranks = 0) {
  pb::JoinRequest j;
  j.set_run_id("mon");
  j.set_name(name);
  j.set_data_parallel(ranks);
  auto r = sync.Join(j);
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

pb::HeartbeatRequest Beat(const pb::JoinResponse& joined, uint64_t step, double loss) {
  pb::HeartbeatRequest b;
  b.set_run_id("mon");
  b.set_island_id(joined.island_id());
  b.set_session(joined.session());
  b.set_inner_step(step);
  auto* t = b.mutable_telemetry();
  t->set_loss(loss);
  t->set_tokens(step * 512);
  t->set_tokens_per_s(1000);
  t->set_utilization(0.9);
  t->set_bytes_sent(step * 100);
  t->set_elements_synced(step * 800);  // 1 bit per parameter and round up, 0 down
  return b;
}

void Contribute(outer::SyncServer& sync, const pb::JoinResponse& joined, uint64_t round,
                float value = 0.01f) {
  std::vector<float> delta(64, value);
  auto chunks = outer::EncodeChunks({"mon", joined.island_id(), round, 0},
                                    {compression::Codec::kFp32, 0}, delta.data(), 0, delta.size(),
                                    delta.size());
  ASSERT_TRUE(chunks.ok());
  std::vector<pb::PushRequest> requests(chunks->size());
  for (size_t i = 0; i < chunks->size(); ++i) {
    *requests[i].mutable_chunk() = (*chunks)[i];
    requests[i].set_tokens(512);
    requests[i].set_session(joined.session());
  }
  auto pushed = sync.Push(requests);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
}

TEST(TelemetryTest, ABadFigureIsRefusedByNameAndChangesNothing) {
  outer::SyncServer sync(TwoIslands(), {{"w"}, {64}}, std::vector<float>(64, 1.0f));
  const auto a = Join(sync, "a");
  ASSERT_TRUE(sync.Heartbeat(Beat(a, 3, 2.5)).ok());
  for (auto [field, value] : std::vector<std::pair<std::string, double>>{
           {"loss", NAN}, {"loss", -1}, {"val_loss", INFINITY}, {"utilization", 1.5},
           {"tokens_per_s", 1e300}}) {
    auto beat = Beat(a, 9, 1.0);
    auto* t = beat.mutable_telemetry();
    if (field == "loss") t->set_loss(value);
    if (field == "val_loss") t->set_val_loss(value);
    if (field == "utilization") t->set_utilization(value);
    if (field == "tokens_per_s") t->set_tokens_per_s(value);
    const auto s = sync.Heartbeat(beat);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(field));
  }
  const auto status = sync.GetStatus();
  ASSERT_EQ(status.islands.size(), 1u);
  EXPECT_EQ(status.islands[0].inner_step, 3u);  // the refused beats changed nothing
  EXPECT_EQ(status.islands[0].telemetry.loss(), 2.5);
}

TEST(ServiceMonitorTest, ExpositionFollowsTheFormatAndCountsWhatHappened) {
  testing::TempDir dir;
  outer::SyncServer sync(TwoIslands(), {{"w"}, {64}}, std::vector<float>(64, 1.0f));
  TrafficCounters traffic;
  ServiceMonitor monitor(sync, &traffic, RunFacts{"mon", false, 2, 4, 1, 10, 40});
  sync.SetCommitListener([&](const outer::CommittedRound& r) { monitor.OnCommit(r); });
  const auto a = Join(sync, "a"), b = Join(sync, "b", /*ranks=*/2);
  for (uint64_t round = 0; round < 3; ++round) {
    ASSERT_TRUE(sync.Heartbeat(Beat(a, 4 * (round + 1), 3.0 - round)).ok());
    ASSERT_TRUE(sync.Heartbeat(Beat(b, 4 * (round + 1), 3.1 - round)).ok());
    Contribute(sync, a, round);
    Contribute(sync, b, round);
    traffic.Add(a.island_id(), 1000, 0);
    traffic.Add(b.island_id(), 1000, 2000);
    monitor.Sample();
  }
  const std::string text = monitor.PrometheusText();
  const auto families = ParseExposition(text);
  CheckConventions(families);
  Promtool(dir, text);
  EXPECT_EQ(Value(families, "atoll_rounds_committed_total", "atoll_rounds_committed_total",
                  {{"fragment", "0"}}), 3);
  EXPECT_EQ(Value(families, "atoll_round_contributors", "atoll_round_contributors_count"), 3);
  EXPECT_EQ(Value(families, "atoll_round_contributors", "atoll_round_contributors_sum"), 6);
  EXPECT_EQ(Value(families, "atoll_commit_duration_seconds", "atoll_commit_duration_seconds_count"), 3);
  EXPECT_EQ(Value(families, "atoll_tokens_committed_total", "atoll_tokens_committed_total"), 6 * 512);
  EXPECT_EQ(Value(families, "atoll_islands", "atoll_islands", {{"state", "active"}}), 2);
  EXPECT_EQ(Value(families, "atoll_islands", "atoll_islands", {{"state", "dead"}}), 0);
  EXPECT_EQ(Value(families, "atoll_service_bytes_total", "atoll_service_bytes_total",
                  {{"island", b.island_id()}, {"direction", "sent"}}), 6000);
  EXPECT_EQ(Value(families, "atoll_island_inner_loss", "atoll_island_inner_loss",
                  {{"island", a.island_id()}}), 1.0);
  EXPECT_EQ(Value(families, "atoll_island_compute_utilization", "atoll_island_compute_utilization",
                  {{"island", b.island_id()}}), 0.9);

  // The status page's data: both islands with their telemetry and curves, the rounds' timeline.
  const auto status = nlohmann::json::parse(monitor.StatusJson());
  EXPECT_EQ(status["committed_rounds"], 3);
  ASSERT_EQ(status["islands"].size(), 2u);
  for (const auto& i : status["islands"]) {
    // The data-parallel ranks each declared at join (none said: one).
    EXPECT_EQ(i["data_parallel"], i["id"] == b.island_id() ? 2 : 1);
    EXPECT_EQ(i["bits_up"], 1.0);
    EXPECT_EQ(i["bits_down"], 0.0);
    EXPECT_EQ(i["state"], "active");
    EXPECT_EQ(i["contributions"], 3);
    EXPECT_EQ(i["step"], 12);
    EXPECT_EQ(i["loss_curve"].size(), 3u);
    EXPECT_EQ(i["last_contribution"]["round"], 2);
  }
  ASSERT_EQ(status["timeline"].size(), 3u);
  EXPECT_EQ(status["timeline"][2]["contributors"].size(), 2u);

  // An island that leaves is counted among former members; its gauges go.
  pb::LeaveRequest leave;
  leave.set_run_id("mon");
  leave.set_island_id(a.island_id());
  leave.set_session(a.session());
  ASSERT_TRUE(sync.Leave(leave).ok());
  const auto after = ParseExposition(monitor.PrometheusText());
  EXPECT_EQ(Value(after, "atoll_islands", "atoll_islands", {{"state", "active"}}), 1);
  EXPECT_TRUE(std::isnan(Value(after, "atoll_island_inner_loss", "atoll_island_inner_loss",
                               {{"island", a.island_id()}})));
}

// What the aggregation flags of an island's contribution is counted per island and reason: two
// islands that push the same values weigh as one copy group in each round (copy detection on).
// A restarted coordinator's status page: the timeline goes on from the rounds its rounds.jsonl
// kept (it lost rounds 0-3 before), and its clock from the last one's wall_s.
TEST(ServiceMonitorTest, AResumedServiceKeepsTheTimelineItLogged) {
  outer::SyncServer sync(TwoIslands(), {{"w"}, {64}}, std::vector<float>(64, 1.0f));
  ServiceMonitor monitor(sync, nullptr, RunFacts{"mon", false, 2, 4, 1, 10, 40});
  std::vector<std::string> logged;
  for (int round = 0; round < 4; ++round) {
    logged.push_back(nlohmann::json{{"round", round}, {"fragment", 0}, {"wall_s", 100.0 + round},
                                    {"commit_s", 0.01}, {"contributors", {"a", "b"}},
                                    {"tokens", 1024}, {"staleness", 0}}
                         .dump());
  }
  logged.push_back("not json");  // skipped, not fatal
  monitor.Resume(logged);
  sync.SetCommitListener([&](const outer::CommittedRound& r) { monitor.OnCommit(r); });
  const auto a = Join(sync, "a"), b = Join(sync, "b");
  Contribute(sync, a, 0);
  Contribute(sync, b, 0);
  const auto timeline = nlohmann::json::parse(monitor.StatusJson())["timeline"];
  ASSERT_EQ(timeline.size(), 5u) << timeline.dump();
  for (int round = 0; round < 4; ++round) {
    EXPECT_EQ(timeline[round]["round"], round);
    EXPECT_EQ(timeline[round]["wall_s"], 100.0 + round);
    EXPECT_EQ(timeline[round]["contributors"], nlohmann::json({"a", "b"}));
  }
  EXPECT_GE(timeline[4]["wall_s"].get<double>(), 103.0);  // after the restored ones, not at 0
}

TEST(ServiceMonitorTest, CountsTheRoundsThatFlaggedAnIsland) {
  testing::TempDir dir;
  for (const bool detect : {true, false}) {
    SCOPED_TRACE(detect ? "copy detection on" : "off");
    auto options = TwoIslands();
    options.aggregation.copies.cosine = detect ? 0.99 : 0.0;
    outer::SyncServer sync(options, {{"w"}, {64}}, std::vector<float>(64, 1.0f));
    ServiceMonitor monitor(sync, nullptr, RunFacts{"mon", false, 2, 4, 1, 10, 40});
    sync.SetCommitListener([&](const outer::CommittedRound& r) { monitor.OnCommit(r); });
    const auto a = Join(sync, "a"), b = Join(sync, "b");
    for (uint64_t round = 0; round < 2; ++round) {
      Contribute(sync, a, round);
      Contribute(sync, b, round);  // the same values as a's
    }
    monitor.Sample();
    const std::string text = monitor.PrometheusText();
    const auto families = ParseExposition(text);
    CheckConventions(families);
    Promtool(dir, text);
    const auto status = nlohmann::json::parse(monitor.StatusJson());
    ASSERT_EQ(status["islands"].size(), 2u);
    for (const auto& joined : {a, b}) {
      const double copies = Value(families, "atoll_island_flagged_rounds_total",
                                  "atoll_island_flagged_rounds_total",
                                  {{"island", joined.island_id()}, {"reason", "copy"}});
      if (detect) {
        EXPECT_EQ(copies, 2);
      } else {
        EXPECT_TRUE(std::isnan(copies));  // no series
      }
    }
    const nlohmann::json expected = detect ? nlohmann::json{{"copy", 2}} : nlohmann::json::object();
    for (const auto& i : status["islands"]) EXPECT_EQ(i["flagged_rounds"], expected) << i["id"];
  }
}

// A probe whose rows' losses are the parameters' mean plus the row's offset: a contribution
// that lowers the parameters buys loss on every row, a negated one costs it.
class MeanProbe : public outer::LossProbe {
 public:
  absl::StatusOr<std::vector<double>> Losses(uint32_t, const float* params, uint64_t n) override {
    double sum = 0;
    for (uint64_t i = 0; i < n; ++i) sum += params[i];
    std::vector<double> rows(8);
    for (size_t r = 0; r < rows.size(); ++r) rows[r] = sum / double(n) + 0.01 * double(r);
    return rows;
  }
  void Set(uint32_t, const float*, uint64_t) override {}
};

// outer.scoring: an island whose contributions cost held-out loss is left out of the rounds it
// harms while its reputation falls; the status page, /api/status and Prometheus show its
// reputation and the rounds that flagged it, and the honest island stays at full weight.
TEST(ServiceMonitorTest, ShowsEachIslandsReputationAndTheRoundsThatLoweredIt) {
  auto options = TwoIslands();
  options.num_data_streams = 3;
  options.scoring.loss_probe = true;
  options.loss_probe = std::make_shared<MeanProbe>();
  outer::SyncServer sync(options, {{"w"}, {64}}, std::vector<float>(64, 1.0f));
  ServiceMonitor monitor(sync, nullptr, RunFacts{"mon", false, 3, 4, 1, 10, 40});
  sync.SetCommitListener([&](const outer::CommittedRound& r) { monitor.OnCommit(r); });
  const auto a = Join(sync, "a"), b = Join(sync, "b"), c = Join(sync, "c");
  for (uint64_t round = 0; round < 3; ++round) {
    Contribute(sync, a, round);
    Contribute(sync, b, round, -0.01f);  // negated: left out as harmful; reputation 0.6, 0.28, 0.024
    Contribute(sync, c, round);
  }
  monitor.Sample();
  const auto families = ParseExposition(monitor.PrometheusText());
  EXPECT_NEAR(Value(families, "atoll_island_reputation", "atoll_island_reputation",
                    {{"island", b.island_id()}}), 0.024, 1e-9);
  EXPECT_EQ(Value(families, "atoll_island_reputation", "atoll_island_reputation",
                  {{"island", a.island_id()}}), 1.0);
  EXPECT_EQ(Value(families, "atoll_island_flagged_rounds_total",
                  "atoll_island_flagged_rounds_total",
                  {{"island", b.island_id()}, {"reason", "harmful"}}),
            3);
  const auto status = nlohmann::json::parse(monitor.StatusJson());
  for (const auto& i : status["islands"]) {
    if (i["id"] != b.island_id()) {
      EXPECT_EQ(i["weight"], 1.0);
      EXPECT_EQ(i["flagged_rounds"], nlohmann::json::object());
    } else {
      EXPECT_EQ(i["weight"], 0.0);
      EXPECT_EQ(i["flagged_rounds"], (nlohmann::json{{"harmful", 3}}));
    }
  }
}

// Before the first evaluation there is no validation loss to show: the series is absent, not 0.
TEST(IslandMonitorTest, ValidationLossIsAbsentUntilTheFirstEvaluation) {
  IslandMonitor monitor("a", 0, /*async=*/false);
  monitor.OnSteps(1, 3.0, 512, 0.1, 0.125);
  EXPECT_THAT(monitor.PrometheusText(), Not(HasSubstr("atoll_validation_loss{")));
  monitor.OnEval(2.5);
  EXPECT_THAT(monitor.PrometheusText(), HasSubstr("atoll_validation_loss{island=\"a\",rank=\"0\"} 2.5"));
}

TEST(IslandMonitorTest, ExpositionFollowsTheFormat) {
  testing::TempDir dir;
  IslandMonitor monitor("a", 0, /*async=*/true);
  for (int step = 1; step <= 10; ++step) monitor.OnSteps(1, 3.0 - 0.1 * step, step * 512, 0.1 * step, 0.125 * step);
  monitor.OnEval(2.25);
  outer::RoundOutcome o;
  o.bytes_sent = 1000;
  o.bytes_received = 3000;
  o.push_s = 0.5;
  o.wait_s = 1.5;
  o.quantization_error = 0.12;
  o.staleness = 2;
  monitor.OnRound(1, o, 0.25);
  monitor.OnCheckpointStall(0.002);
  monitor.OnCheckpointWritten(0.05);
  const std::string text = monitor.PrometheusText();
  const auto families = ParseExposition(text);
  CheckConventions(families);
  Promtool(dir, text);
  const std::map<std::string, std::string> me = {{"island", "a"}, {"rank", "0"}};
  EXPECT_NEAR(Value(families, "atoll_inner_loss", "atoll_inner_loss", me), 2.0, 1e-12);
  EXPECT_EQ(Value(families, "atoll_validation_loss", "atoll_validation_loss", me), 2.25);
  EXPECT_NEAR(Value(families, "atoll_tokens_per_second", "atoll_tokens_per_second", me), 512 / 0.125, 1e-6);
  EXPECT_NEAR(Value(families, "atoll_compute_utilization", "atoll_compute_utilization", me), 0.8, 1e-12);
  EXPECT_EQ(Value(families, "atoll_outer_goodput_bytes_per_second",
                  "atoll_outer_goodput_bytes_per_second", me), 2000);
  EXPECT_EQ(Value(families, "atoll_quantization_error", "atoll_quantization_error",
                  {{"fragment", "1"}}), 0.12);
  EXPECT_EQ(Value(families, "atoll_outer_bytes_total", "atoll_outer_bytes_total",
                  {{"direction", "received"}}), 3000);
  EXPECT_EQ(Value(families, "atoll_idle_seconds_total", "atoll_idle_seconds_total"), 0.25);
  EXPECT_EQ(Value(families, "atoll_outer_staleness", "atoll_outer_staleness_sum"), 2);
  EXPECT_EQ(Value(families, "atoll_checkpoint_write_seconds", "atoll_checkpoint_write_seconds_count"), 1);
}

// ---------------------------------------------------------------------------------------------
// End to end: a 2-island `atoll local` run with --metrics-listen and --http-listen. A real
// Prometheus scrapes the coordinator and both islands every second; a real headless Chromium
// renders the status page, which must show both islands of the live run; then the run is stopped
// and Prometheus's own storage must hold every metric, scraped healthy.

// The addresses each process printed: "coordinator" (metrics), "status" (page), "island<i>".
std::map<std::string, std::string> Addresses(const std::string& log) {
  std::map<std::string, std::string> found;
  static const std::regex kLine(
      "(\\[(island\\d+)\\] metrics|coordinator: (metrics|status page)) on http://([^/\\s]+)/");
  for (std::sregex_iterator it(log.begin(), log.end(), kLine), end; it != end; ++it) {
    const auto& m = *it;
    const std::string who = m[2].matched ? m[2].str() : m[3] == "metrics" ? "coordinator" : "status";
    found[who] = m[4];
  }
  return found;
}

// An instant query to Prometheus's HTTP API: the value of each series of the result, by the
// series' labels (empty when the query failed or matched nothing).
std::vector<std::pair<std::map<std::string, std::string>, double>> Query(const std::string& prometheus,
                                                                         const std::string& query) {
  httplib::Client client("http://" + prometheus);
  client.set_read_timeout(10);
  auto r = client.Get("/api/v1/query", httplib::Params{{"query", query}}, httplib::Headers{});
  std::vector<std::pair<std::map<std::string, std::string>, double>> out;
  if (!r || r->status != 200) return out;
  const auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_discarded() || j.value("status", "") != "success") return out;
  for (const auto& series : j["data"]["result"]) {
    double v = NAN;
    ParseValue(series["value"][1].get<std::string>(), &v);
    out.emplace_back(series["metric"].get<std::map<std::string, std::string>>(), v);
  }
  return out;
}

// The status page, rendered by Chromium after its script has fetched /api/status, shows both
// islands of a live run; a screenshot of it is kept for people (ATOLL_SCREENSHOT=path).
void ExpectStatusPageShowsTheRun(const testing::TempDir& dir, const std::string& status) {
  const std::string chromium =
      "timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage "
      "--no-first-run --user-data-dir=" + dir.Join("chromium") + " --virtual-time-budget=5000 ";
  const auto dom = testing::RunCommand(chromium + "--dump-dom http://" + status + "/ 2>" +
                                       dir.Join("chromium.log"));
  ASSERT_EQ(dom.exit_code, 0) << testing::ReadFile(dir.Join("chromium.log"));
  EXPECT_THAT(dom.output, HasSubstr("id=\"island-island0\""));
  EXPECT_THAT(dom.output, HasSubstr("id=\"island-island1\""));
  EXPECT_THAT(dom.output, HasSubstr("class=\"state-active\""));
  EXPECT_THAT(dom.output, HasSubstr("rounds committed"));
  // Each island's token account: on time / stale / refused / recomputed of trained.
  EXPECT_THAT(dom.output,
              ::testing::ContainsRegex("<td><span>[0-9]+ / [0-9]+ / [0-9]+ / [0-9]+ of [0-9]+"));
  EXPECT_THAT(dom.output, HasSubstr("data-islands=\"2\""));
  EXPECT_THAT(dom.output, HasSubstr("<div id=\"error\"></div>"));  // its fetch succeeded
  // In a laptop's window (1280 px) the islands table is narrower than the window.
  const auto narrow = testing::RunCommand(chromium + "--window-size=1280,800 --dump-dom http://" + status +
                                          "/ 2>/dev/null");
  int width = 0;
  const auto at = narrow.output.find("data-width=\"");
  ASSERT_NE(at, std::string::npos) << narrow.output.substr(0, 2000);
  ASSERT_TRUE(absl::SimpleAtoi(narrow.output.substr(at + 12, narrow.output.find('"', at + 12) - at - 12), &width));
  EXPECT_LE(width, 1280);
  const char* keep = std::getenv("ATOLL_SCREENSHOT");
  const std::string png = keep != nullptr ? keep : dir.Join("status.png");
  testing::RunCommand(chromium + "--window-size=1500,1150 --screenshot=" + png + " http://" +
                      status + "/ 2>/dev/null");
}

// Waits (30 s at most) until Prometheus at `api` has scraped every target healthy, then a few
// scrapes more.
void WaitForHealthyTargets(const std::string& api, const std::set<std::string>& targets,
                           const std::string& prometheus_log) {
  std::set<std::string> healthy;
  for (int i = 0; i < 60 && healthy.size() < targets.size(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    healthy.clear();
    for (const auto& [labels, v] : Query(api, "up == 1")) healthy.insert(labels.at("instance"));
  }
  EXPECT_EQ(healthy, targets) << testing::ReadFile(prometheus_log);
  std::this_thread::sleep_for(std::chrono::seconds(2));
}

// Each metric's largest value Prometheus stored over the last minute (every one must be there).
std::map<std::string, double> MaxOverTheLastMinute(const std::string& api) {
  std::map<std::string, double> max_of;
  for (const char* name :
       {"atoll_rounds_committed_total", "atoll_round_duration_seconds_bucket",
        "atoll_commit_duration_seconds_count", "atoll_round_contributors_sum", "atoll_islands",
        "atoll_lease_expiries_total", "atoll_service_bytes_total", "atoll_contribution_staleness_count",
        "atoll_island_inner_loss", "atoll_island_validation_loss", "atoll_island_tokens_per_second",
        "atoll_island_compute_utilization", "atoll_tokens_committed_total",
        "atoll_island_tokens_total", "atoll_inner_loss",
        "atoll_validation_loss", "atoll_tokens_per_second", "atoll_compute_utilization",
        "atoll_idle_seconds_total", "atoll_outer_bytes_total", "atoll_outer_goodput_bytes_per_second",
        "atoll_quantization_error", "atoll_outer_push_seconds_count", "atoll_outer_wait_seconds_count",
        "atoll_checkpoint_stall_seconds_count", "atoll_checkpoint_write_seconds_count",
        "atoll_outer_staleness_count", "atoll_inner_steps_total"}) {
    const auto result = Query(api, absl::StrCat("max(max_over_time(", name, "[1m]))"));
    EXPECT_EQ(result.size(), 1u) << name << " was never scraped";
    if (result.size() == 1) max_of[name] = result[0].second;
  }
  return max_of;
}

// A Prometheus scraping the coordinator and both islands every second.
void WritePrometheusConfig(const testing::TempDir& dir,
                           const std::map<std::string, std::string>& at) {
  testing::WriteFile(dir.Join("prometheus.yml"),
                     "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
                     "scrape_configs:\n"
                     "  - job_name: atoll-coordinator\n    static_configs:\n      - targets: ['" +
                         at.at("coordinator") + "']\n"
                     "  - job_name: atoll-islands\n    static_configs:\n      - targets: ['" +
                         at.at("island0") + "', '" + at.at("island1") + "']\n");
}

TEST(MonitoringEndToEndTest, PrometheusScrapesAndChromiumShowsALiveLocalRun) {
  for (const char* tool : {"prometheus", "promtool", "chromium"}) {
    if (!Have(tool)) GTEST_SKIP() << tool << " is not installed (deploy/setup.sh installs it)";
  }
  testing::TempDir dir;
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(60000, 9));
  testing::WriteFile(dir.Join("run.toml"),
                     "[model]\nn_layer = 2\nd_model = 32\nn_head = 2\ncontext = 32\n"
                     "[data]\npath = \"" + dir.Join("text.txt") + "\"\nval_fraction = 0.1\n"
                     "[train]\nsteps = 2000\nbatch_size = 4\neval_every = 8\neval_batches = 2\n"
                     "threads = 1\ncheckpoint_every = 8\n[optim]\nwarmup_steps = 2\n"
                     "[outer]\nsync_every = 4\nheartbeat_s = 0.2\ncodec = \"fp4_e2m1\"\n");
  // Throttled: the run goes on (it is stopped below) while the tools look at it.
  ChildProcess run({ATOLL_BIN, "local", "--islands", "2", "--config", dir.Join("run.toml"),
                    "--run-dir", dir.Join("run"), "--throttle", "6,6", "--metrics-listen",
                    "127.0.0.1:0", "--http-listen", "127.0.0.1:0"},
                   dir.Join("local.log"));
  std::string log = run.WaitForOutput("committed (3/", 120);
  auto at = Addresses(log);
  ASSERT_EQ(at.size(), 4u) << log;

  // Every endpoint passes the format's rules and promtool's lint.
  for (const auto& [who, address] : at) {
    if (who == "status") continue;
    const std::string text = Get(address, "/metrics");
    SCOPED_TRACE(who);
    CheckConventions(ParseExposition(text));
    Promtool(dir, text);
  }
  int status = 0;
  EXPECT_EQ(Get(at["status"], "/healthz", &status), "ok\n");
  EXPECT_EQ(status, 200);

  // The scrape config users start from is valid too.
  const auto config = testing::RunCommand(std::string("promtool check config ") + ATOLL_SOURCE_DIR +
                                          "/deploy/monitoring/prometheus.yml 2>&1");
  EXPECT_EQ(config.exit_code, 0) << config.output;
  WritePrometheusConfig(dir, at);
  ChildProcess prometheus({Which("prometheus"), "--config.file=" + dir.Join("prometheus.yml"),
                           "--storage.tsdb.path=" + dir.Join("tsdb"),
                           "--web.listen-address=127.0.0.1:0"},
                          dir.Join("prometheus.log"));

  ExpectStatusPageShowsTheRun(dir, at["status"]);
  if (::testing::Test::HasFatalFailure()) return;

  // Prometheus says where its API listens; wait until it has scraped all three targets healthy.
  const std::string plog = prometheus.WaitForOutput("Server is ready to receive web requests", 60);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(plog, m, std::regex("msg=\"Listening on\" address=(\\S+)"))) << plog;
  const std::string api = m[1];
  WaitForHealthyTargets(api, {at["coordinator"], at["island0"], at["island1"]},
                        dir.Join("prometheus.log"));
  std::map<std::string, double> max_of = MaxOverTheLastMinute(api);
  // Stopped by the user (SIGTERM): atoll local stops its children and ends (not by a signal).
  EXPECT_NE(run.Terminate(30), -1) << testing::ReadFile(dir.Join("local.log"));
  EXPECT_EQ(prometheus.Terminate(30), 0) << testing::ReadFile(dir.Join("prometheus.log"));
  // Plausible values: rounds committed, losses of a byte-level model, a fraction of time computing,
  // FP4's error on Gaussian-like pseudo-gradients (about 0.1), bytes and checkpoints.
  EXPECT_GE(max_of["atoll_rounds_committed_total"], 3);
  EXPECT_GT(max_of["atoll_inner_loss"], 0.5);
  EXPECT_LT(max_of["atoll_inner_loss"], 6);
  EXPECT_GT(max_of["atoll_compute_utilization"], 0);
  EXPECT_LE(max_of["atoll_compute_utilization"], 1);
  EXPECT_GT(max_of["atoll_quantization_error"], 0.02);
  EXPECT_LT(max_of["atoll_quantization_error"], 0.5);
  EXPECT_GT(max_of["atoll_service_bytes_total"], 0);
  EXPECT_GT(max_of["atoll_tokens_per_second"], 0);
  EXPECT_GE(max_of["atoll_checkpoint_write_seconds_count"], 1);
  EXPECT_EQ(max_of["atoll_islands"], 2);
}

}  // namespace
}  // namespace atl
