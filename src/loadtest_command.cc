#include "src/loadtest_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "atoll/v1/outer.grpc.pb.h"
#include "compression/checksum.h"
#include "inner/model.h"
#include "outer/credentials.h"
#include "outer/outer_config.h"
#include "outer/payload.h"
#include "src/atomic_file.h"
#include "src/child_process.h"
#include "src/flat_params.h"
#include "src/metrics.h"
#include "src/rpc_security.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
namespace pb = ::atollpb::v1;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

std::string Gib(double bytes) { return absl::StrFormat("%.2f GiB", bytes / double(1 << 30)); }

// One heartbeat: when it was sent and how long its answer took.
struct Beat {
  Clock::time_point sent;
  double latency_s = 0;
};

// What one island saw of one round.
struct RoundTimes {
  Clock::time_point sent;          // its last chunk written
  Clock::time_point first_update;  // the first chunk of the update received
  Clock::time_point done;          // the whole update received
  uint64_t bytes_pushed = 0, bytes_received = 0;
};

// A synthetic island: joins, heartbeats in its own thread, pushes random pseudo-gradients of the
// whole model chunk by chunk (a few distinct random chunks cycled, so that nothing of the model's
// size is ever held here) and reads every round's update, checking each chunk's checksum.
class SyntheticIsland {
 public:
  SyntheticIsland(int index, const Config& config, const std::string& address,
                  const std::string& token, uint64_t elements)
      : index_(index), config_(config), token_(token), elements_(elements) {
    grpc::ChannelArguments args;
    args.SetInt("atoll.loadtest.island", index);  // a TCP connection of its own
    args.SetMaxReceiveMessageSize(64 << 20);
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    coordinator_ = pb::Coordinator::NewStub(channel_);
    sync_ = pb::OuterSync::NewStub(channel_);
  }
  ~SyntheticIsland() { StopHeartbeats(); }

  absl::Status Join() {
    pb::JoinRequest j;
    j.set_run_id(config_.outer.run_id);
    j.set_name(absl::StrCat("load", index_));
    j.set_config_hash(ModelConfigHash(config_.model));
    grpc::ClientContext ctx;
    Prepare(&ctx, 120);
    ctx.set_wait_for_ready(true);
    if (auto s = FromGrpc(coordinator_->Join(&ctx, j, &join_), "join"); !s.ok()) return s;
    return MakeChunks();
  }

  void StartHeartbeats(double every_s) {
    heartbeat_ = std::thread([this, every_s] {
      while (!stop_.load()) {
        pb::HeartbeatRequest h;
        h.set_run_id(config_.outer.run_id);
        h.set_island_id(join_.island_id());
        h.set_session(join_.session());
        h.set_inner_step(step_.load());
        pb::HeartbeatResponse r;
        grpc::ClientContext ctx;
        Prepare(&ctx, 30);
        const auto t0 = Clock::now();
        const grpc::Status s = coordinator_->Heartbeat(&ctx, h, &r);
        const auto t1 = Clock::now();
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (s.ok()) {
            beats_.push_back({t0, Seconds(t0, t1)});
          } else {
            ++failed_beats_;
          }
        }
        std::this_thread::sleep_for(std::chrono::duration<double>(every_s));
      }
    });
  }
  void StopHeartbeats() {
    stop_ = true;
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  // Pushes this island's contribution to `round`, then reads the round's update.
  absl::StatusOr<RoundTimes> Round(uint64_t round) {
    RoundTimes t;
    step_ = (round + 1) * uint64_t(config_.outer.sync_every);
    {
      grpc::ClientContext ctx;
      Prepare(&ctx, config_.outer.round_timeout_s);
      pb::PushResponse response;
      auto writer = sync_->Push(&ctx, &response);
      for (uint32_t c = 0; c < plan_.num_chunks; ++c) {
        const bool tail = c + 1 == plan_.num_chunks;
        pb::PushRequest m;
        *m.mutable_chunk() = tail ? tail_ : pool_[(c + uint32_t(index_)) % pool_.size()];
        auto* h = m.mutable_chunk()->mutable_header();
        h->set_island_id(join_.island_id());
        h->set_round(round);
        h->set_offset(uint64_t(c) * plan_.per_chunk);
        h->set_chunk_index(c);
        m.set_tokens(tokens_);
        if (c == 0) m.set_session(join_.session());
        t.bytes_pushed += m.ByteSizeLong();
        if (!writer->Write(m)) break;
      }
      writer->WritesDone();
      t.sent = Clock::now();
      if (auto s = FromGrpc(writer->Finish(), absl::StrCat("push of round ", round)); !s.ok()) {
        return s;
      }
    }
    grpc::ClientContext ctx;
    Prepare(&ctx, 2 * config_.outer.round_timeout_s);
    pb::UpdateRequest u;
    u.set_run_id(config_.outer.run_id);
    u.set_island_id(join_.island_id());
    u.set_session(join_.session());
    u.set_round(round);
    auto reader = sync_->AwaitUpdate(&ctx, u);
    pb::UpdateChunk chunk;
    uint64_t covered = 0;
    while (reader->Read(&chunk)) {
      if (covered == 0) t.first_update = Clock::now();
      if (compression::Checksum(chunk.chunk().data().data(), chunk.chunk().data().size()) !=
          chunk.chunk().xxh64()) {
        return absl::DataLossError(absl::StrCat("an update chunk of round ", round,
                                                " does not match its checksum"));
      }
      covered += chunk.chunk().header().num_elements();
      t.bytes_received += chunk.ByteSizeLong();
    }
    if (auto s = FromGrpc(reader->Finish(), absl::StrCat("update of round ", round)); !s.ok()) {
      return s;
    }
    if (covered != elements_) {
      return absl::DataLossError(absl::StrCat("the update of round ", round, " covers ", covered,
                                              " of ", elements_, " elements"));
    }
    t.done = Clock::now();
    return t;
  }

  absl::Status Leave() {
    pb::LeaveRequest l;
    l.set_run_id(config_.outer.run_id);
    l.set_island_id(join_.island_id());
    l.set_session(join_.session());
    pb::LeaveResponse r;
    grpc::ClientContext ctx;
    Prepare(&ctx, 30);
    return FromGrpc(coordinator_->Leave(&ctx, l, &r), "leave");
  }

  std::vector<Beat> beats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return beats_;
  }
  int failed_beats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_beats_;
  }
  uint64_t contribution_bytes() const {
    uint64_t n = tail_.ByteSizeLong();
    for (uint32_t c = 0; c + 1 < plan_.num_chunks; ++c) n += pool_[c % pool_.size()].ByteSizeLong();
    return n;
  }

 private:
  void Prepare(grpc::ClientContext* ctx, double timeout_s) const {
    ctx->AddMetadata(kAuthMetadata, "Bearer " + token_);
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(int64_t(timeout_s * 1000)));
  }

  // A few chunks of random values well inside the service's bounds (pseudo-gradients of about
  // 1e-3 against parameters of about 2e-2), and the payload's last, shorter one.
  absl::Status MakeChunks() {
    const auto codec = *compression::ParseCodec(config_.outer.codec);
    plan_ = outer::PlanChunks(codec, elements_);
    tokens_ = uint64_t(config_.outer.sync_every) * uint64_t(config_.train.batch_size) *
              uint64_t(config_.train.grad_accum) * uint64_t(config_.model.context);
    uint64_t state = 0x9e3779b97f4a7c15ULL * uint64_t(index_ + 1);
    std::vector<float> values(plan_.per_chunk);
    auto encode = [&](uint64_t count, uint32_t index) -> absl::StatusOr<pb::Chunk> {
      for (uint64_t k = 0; k < count; ++k) {
        state += 0x9e3779b97f4a7c15ULL;  // splitmix64
        uint64_t z = state;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        values[k] = float((double(z >> 11) * 0x1.0p-53 - 0.5) * 4e-3);
      }
      return outer::EncodeChunk({config_.outer.run_id, join_.island_id(), 0, 0}, codec,
                                values.data(), 0, count, elements_, index, plan_.num_chunks);
    };
    const uint32_t distinct = std::min<uint32_t>(3, plan_.num_chunks - 1);
    for (uint32_t i = 0; i < distinct; ++i) {
      auto c = encode(plan_.per_chunk, 0);
      if (!c.ok()) return c.status();
      pool_.push_back(*std::move(c));
    }
    const uint64_t last = elements_ - uint64_t(plan_.num_chunks - 1) * plan_.per_chunk;
    auto c = encode(last, plan_.num_chunks - 1);
    if (!c.ok()) return c.status();
    tail_ = *std::move(c);
    return absl::OkStatus();
  }

  const int index_;
  const Config& config_;
  const std::string token_;
  const uint64_t elements_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Coordinator::Stub> coordinator_;
  std::unique_ptr<pb::OuterSync::Stub> sync_;
  pb::JoinResponse join_;
  outer::ChunkPlan plan_;
  uint64_t tokens_ = 0;
  std::vector<pb::Chunk> pool_;
  pb::Chunk tail_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> step_{0};
  std::thread heartbeat_;
  mutable std::mutex mu_;
  std::vector<Beat> beats_;
  int failed_beats_ = 0;
};

bool Overridden(const std::vector<Override>& overrides, const std::string& key) {
  return std::any_of(overrides.begin(), overrides.end(),
                     [&](const Override& o) { return o.first == key; });
}

// The run's config: the user's, with the model sized to the parameters asked for, M islands that
// must all contribute, and R rounds of H steps.
absl::StatusOr<Config> LoadtestConfig(const LoadtestOptions& o) {
  // The coordinator reads no data; a run's config names some all the same.
  std::vector<Override> overrides = {{"data.path", "none (load test: nothing is trained)"}};
  overrides.insert(overrides.end(), o.overrides.begin(), o.overrides.end());
  auto loaded = LoadConfig(o.config_path, overrides);
  if (!loaded.ok()) return loaded.status();
  Config c = *loaded;
  const inner::ModelConfig sized = ModelForParams(o.params);
  c.model.n_layer = sized.n_layer;
  c.model.d_model = sized.d_model;
  c.model.n_head = sized.n_head;
  c.model.context = sized.context;
  c.outer.islands = o.islands;
  c.outer.mode = "sync";
  if (!Overridden(o.overrides, "outer.min_islands")) c.outer.min_islands = o.islands;
  // Without a durable state write each round (4 bytes x 2 per parameter) the test measures the
  // service; --outer.durable_every=1 measures it with durability (updates wait for the write).
  if (!Overridden(o.overrides, "outer.durable_every")) c.outer.durable_every = o.rounds + 1;
  c.train.steps = int64_t(o.rounds) * c.outer.sync_every;
  if (c.outer.num_fragments != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loadtest pushes whole-model rounds: outer.num_fragments must be 1, got ",
        c.outer.num_fragments));
  }
  if (auto s = inner::Validate(c.model); !s.ok()) return s;
  if (auto s = outer::Validate(c.outer); !s.ok()) return s;
  return c;
}

absl::Status CheckOptions(const LoadtestOptions& o) {
  if (o.params < 10'000 || o.params > 100'000'000'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--params must be between 10000 and 1e11, got ", o.params));
  }
  if (o.islands < 1 || o.islands > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--islands must be 1 to 64, got ", o.islands));
  }
  if (o.rounds < 1 || o.rounds > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("--rounds must be 1 to 1000, got ", o.rounds));
  }
  if (o.shards != 1) {
    return absl::UnimplementedError(absl::StrCat(
        "--shards ", o.shards, ": a sharded outer-sync service does not exist yet; only 1 shard "
        "(one coordinator) can be tested"));
  }
  if (o.run_dir.empty()) return absl::InvalidArgumentError("--run-dir is required");
  return absl::OkStatus();
}

// Sorts the heartbeats of every island into those that overlapped a commit and the others.
void SummarizeHeartbeats(const std::vector<std::unique_ptr<SyntheticIsland>>& islands,
                         const std::vector<std::pair<Clock::time_point, Clock::time_point>>& commits,
                         LoadtestReport& report) {
  std::vector<double> all, during;
  for (const auto& island : islands) {
    for (const Beat& b : island->beats()) {
      const double ms = 1e3 * b.latency_s;
      all.push_back(ms);
      const auto end = b.sent + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(b.latency_s));
      for (const auto& [from, to] : commits) {
        if (b.sent < to && end > from) {
          during.push_back(ms);
          break;
        }
      }
    }
  }
  report.heartbeats = int(all.size());
  report.commit_heartbeats = int(during.size());
  report.heartbeat_p50_ms = Percentile(all, 0.5);
  report.heartbeat_p99_ms = Percentile(all, 0.99);
  report.heartbeat_max_ms = all.empty() ? 0 : *std::max_element(all.begin(), all.end());
  report.commit_heartbeat_p99_ms = Percentile(during, 0.99);
}

void PrintReport(const LoadtestReport& r, FILE* out) {
  std::vector<double> commits = r.commit_s;
  std::fprintf(out, "commit time (last chunk pushed -> first update chunk): median %.3f s, max %.3f s\n",
               Percentile(commits, 0.5), commits.empty() ? 0.0 : *std::max_element(commits.begin(), commits.end()));
  const double budget = 3.5 * r.model_bytes + r.islands * r.contribution_bytes;
  std::fprintf(out,
               "service peak RSS %s = %.2f x the fp32 model (%s); budget 3.5 x model + %d "
               "contributions of %s = %s: %s\n",
               Gib(double(r.rss_peak)).c_str(), double(r.rss_peak) / r.model_bytes,
               Gib(r.model_bytes).c_str(), r.islands, Gib(r.contribution_bytes).c_str(),
               Gib(budget).c_str(), double(r.rss_peak) <= budget ? "within" : "OVER");
  std::fprintf(out,
               "heartbeats: %d, p50 %.1f ms, p99 %.1f ms, max %.1f ms; %d while a round was "
               "committed, their p99 %.1f ms\n",
               r.heartbeats, r.heartbeat_p50_ms, r.heartbeat_p99_ms, r.heartbeat_max_ms,
               r.commit_heartbeats, r.commit_heartbeat_p99_ms);
  std::fprintf(out, "goodput: pushes %.1f MB/s (encoded, all islands), rounds %.1f MB/s (pushed + "
               "received); wall %.1f s\n",
               r.push_goodput / 1e6, r.round_goodput / 1e6, r.wall_s);
  std::fflush(out);
}

nlohmann::json ToJson(const LoadtestReport& r) {
  return {{"params", r.params},
          {"codec", r.codec},
          {"islands", r.islands},
          {"rounds", r.rounds},
          {"service_threads", r.service_threads},
          {"model_bytes", r.model_bytes},
          {"contribution_bytes", r.contribution_bytes},
          {"rss_start", r.rss_start},
          {"rss_peak", r.rss_peak},
          {"push_s", r.push_s},
          {"commit_s", r.commit_s},
          {"round_s", r.round_s},
          {"heartbeats", r.heartbeats},
          {"heartbeat_p50_ms", r.heartbeat_p50_ms},
          {"heartbeat_p99_ms", r.heartbeat_p99_ms},
          {"heartbeat_max_ms", r.heartbeat_max_ms},
          {"commit_heartbeats", r.commit_heartbeats},
          {"commit_heartbeat_p99_ms", r.commit_heartbeat_p99_ms},
          {"push_goodput", r.push_goodput},
          {"round_goodput", r.round_goodput},
          {"wall_s", r.wall_s}};
}

}  // namespace

inner::ModelConfig ModelForParams(int64_t params) {
  inner::ModelConfig m;
  m.context = 128;
  m.vocab = 256;
  // Wide enough for about 4 blocks of 12 d^2 parameters, a multiple of the head size 64.
  m.d_model = 64 * std::max<int>(1, int(std::sqrt(double(params) / 48.0) / 64.0));
  m.n_head = m.d_model / 64;
  const double d = m.d_model;
  const double per_block = 12 * d * d + 13 * d;
  const double outside = 2.0 * m.vocab * d + m.context * d + 2 * d;
  m.n_layer = std::max(1, int(std::lround((double(params) - outside) / per_block)));
  return m;
}

absl::StatusOr<LoadtestReport> RunLoadtest(const LoadtestOptions& o) {
  if (auto s = CheckOptions(o); !s.ok()) return s;
  auto loaded = LoadtestConfig(o);
  if (!loaded.ok()) return loaded.status();
  const Config config = *loaded;
  std::error_code ec;
  fs::create_directories(o.run_dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot create ", o.run_dir, ": ", ec.message()));
  const std::string config_path = (fs::path(o.run_dir) / "config.toml").string();
  if (auto s = WriteFileAtomic(config_path, ToToml(config)); !s.ok()) return s;

  LoadtestReport report;
  report.params = inner::ParameterCount(config.model);
  report.codec = config.outer.codec;
  report.islands = o.islands;
  report.rounds = o.rounds;
  report.service_threads = config.outer.service_threads;
  report.model_bytes = 4.0 * double(report.params);
  std::fprintf(o.out,
               "atoll loadtest: %lld parameters (n_layer %d, d_model %d), %s, %d islands, %d "
               "rounds, %d service threads\n",
               (long long)report.params, config.model.n_layer, config.model.d_model,
               config.outer.codec.c_str(), o.islands, o.rounds, config.outer.service_threads);
  std::fflush(o.out);

  const std::string token = outer::NewCredential();
  setenv("ATOLL_TOKEN", token.c_str(), 1);
  ChildProcess coordinator({o.binary, "coordinator", "--config", config_path, "--listen",
                            "127.0.0.1:0", "--run-dir", (fs::path(o.run_dir) / "coordinator").string()},
                           (fs::path(o.run_dir) / "coordinator.log").string());
  unsetenv("ATOLL_TOKEN");
  const std::string log = coordinator.WaitForOutput("listening on ", 600);
  const auto at = log.find("listening on ");
  if (at == std::string::npos) {
    return absl::InternalError(absl::StrCat("the coordinator did not start; see ", o.run_dir,
                                            "/coordinator.log:\n", log.substr(0, 2000)));
  }
  const std::string address = log.substr(at + 13, log.find(' ', at + 13) - at - 13);
  report.rss_start = coordinator.RssBytes();
  std::fprintf(o.out, "coordinator at %s (pid %d), resident %s once listening (peak so far %s)\n",
               address.c_str(), coordinator.pid(), Gib(double(report.rss_start)).c_str(),
               Gib(double(coordinator.PeakRssBytes())).c_str());
  std::fflush(o.out);

  const auto start = Clock::now();
  std::vector<std::unique_ptr<SyntheticIsland>> islands;
  for (int i = 0; i < o.islands; ++i) {
    islands.push_back(std::make_unique<SyntheticIsland>(i, config, address, token,
                                                        uint64_t(report.params)));
    if (auto s = islands.back()->Join(); !s.ok()) return s;
    islands.back()->StartHeartbeats(o.heartbeat_every_s);
  }
  report.contribution_bytes = double(islands.front()->contribution_bytes());

  std::vector<std::pair<Clock::time_point, Clock::time_point>> commits;
  double pushed = 0, moved = 0, push_time = 0, round_time = 0;
  for (int r = 0; r < o.rounds; ++r) {
    if (o.stop != nullptr && o.stop->load()) return absl::CancelledError("stopped");
    const auto t0 = Clock::now();
    std::vector<absl::StatusOr<RoundTimes>> times(islands.size(), absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < islands.size(); ++i) {
      threads.emplace_back([&, i] { times[i] = islands[i]->Round(uint64_t(r)); });
    }
    for (auto& t : threads) t.join();
    Clock::time_point sent = t0, first = Clock::time_point::max(), done = t0;
    for (const auto& t : times) {
      if (!t.ok()) return t.status();
      sent = std::max(sent, t->sent);
      first = std::min(first, t->first_update);
      done = std::max(done, t->done);
      pushed += double(t->bytes_pushed);
      moved += double(t->bytes_pushed + t->bytes_received);
    }
    commits.emplace_back(sent, first);
    report.push_s.push_back(Seconds(t0, sent));
    report.commit_s.push_back(std::max(0.0, Seconds(sent, first)));
    report.round_s.push_back(Seconds(t0, done));
    push_time += Seconds(t0, sent);
    round_time += Seconds(t0, done);
    std::fprintf(o.out, "round %d/%d: pushes %.2f s, commit %.3f s, whole round %.2f s, "
                 "coordinator resident %s\n",
                 r + 1, o.rounds, report.push_s.back(), report.commit_s.back(),
                 report.round_s.back(), Gib(double(coordinator.RssBytes())).c_str());
    std::fflush(o.out);
  }
  report.rss_peak = coordinator.PeakRssBytes();  // before the islands leave: still running
  for (auto& island : islands) island->StopHeartbeats();
  report.wall_s = Seconds(start, Clock::now());
  for (auto& island : islands) {
    if (auto s = island->Leave(); !s.ok()) return s;
    if (const int failed = island->failed_beats(); failed > 0) {
      return absl::InternalError(absl::StrCat(failed, " heartbeats failed; see ", o.run_dir,
                                              "/coordinator.log"));
    }
  }
  SummarizeHeartbeats(islands, commits, report);
  report.push_goodput = push_time > 0 ? pushed / push_time : 0;
  report.round_goodput = round_time > 0 ? moved / round_time : 0;
  // The coordinator ends by itself after the last round once every island has left.
  if (const int code = coordinator.Wait(600); code != 0) {
    return absl::InternalError(absl::StrCat("the coordinator ended with ", code, "; see ",
                                            o.run_dir, "/coordinator.log"));
  }
  PrintReport(report, o.out);
  if (auto s = WriteFileAtomic((fs::path(o.run_dir) / "loadtest.json").string(),
                               ToJson(report).dump(2) + "\n");
      !s.ok()) {
    return s;
  }
  return report;
}

}  // namespace atl
