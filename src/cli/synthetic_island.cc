#include "src/cli/synthetic_island.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "atoll/v1/outer.grpc.pb.h"
#include "compression/checksum.h"
#include "compression/status_macros.h"
#include "inner/loop.h"
#include "outer/base/fragments.h"
#include "outer/island/outer_step.h"
#include "outer/base/payload.h"
#include "src/net/rpc_security.h"
#include "src/store/flat_params.h"

namespace atl {
namespace {

namespace pb = ::atollpb::v1;

double Seconds(LoadClock::time_point a, LoadClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

double RoundTimes::CommitSeconds() const {
  double longest = 0;
  for (const Fragment& f : fragments) longest = std::max(longest, Seconds(f.sent, f.first_update));
  return longest;
}

// A synthetic island: joins, heartbeats in its own thread, pushes random pseudo-gradients of every
// fragment chunk by chunk (a few distinct random chunks cycled, so that nothing of the model's size
// is ever held here) and reads every round's update, checking each chunk's checksum. A sharded
// service gets each fragment's push on a connection to its shard, all fragments at once.
class SyntheticIsland {
 public:
  SyntheticIsland(int index, const Config& config, const std::string& address,
                  const std::string& token)
      : index_(index), config_(config), token_(token) {
    // Membership calls and heartbeats on a connection of their own, so that a lease never waits
    // behind a push's megabytes.
    coordinator_ = pb::Coordinator::NewStub(Channel(address, kControlLane));
    sync_.push_back(pb::OuterSync::NewStub(Channel(address, kDataLane)));
  }
  ~SyntheticIsland() { StopHeartbeats(); }

  absl::Status Join() {
    pb::JoinRequest j;
    j.set_run_id(config_.outer.run_id);
    j.set_name(absl::StrCat("load", index_));
    j.set_config_hash(ModelConfigHash(config_.model));
    // The coordinator of a sharded service takes joins once every shard has reached it.
    for (int tries = 0;; ++tries) {
      grpc::ClientContext ctx;
      Prepare(&ctx, 120);
      ctx.set_wait_for_ready(true);
      auto s = FromGrpc(coordinator_->Join(&ctx, j, &join_), "join");
      if (s.ok()) break;
      if (!absl::IsUnavailable(s) || tries >= 600) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (join_.shards_size() > 0) {
      sync_.clear();
      for (const auto& address : join_.shards()) {
        sync_.push_back(pb::OuterSync::NewStub(Channel(address, kDataLane)));
      }
    }
    for (const auto& f : join_.fragments()) {
      ATL_ASSIGN_OR_RETURN(auto made, MakeChunks(f.fragment(), f.num_elements()));
      fragments_.push_back(std::move(made));
    }
    return absl::OkStatus();
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
        const auto t0 = LoadClock::now();
        const grpc::Status s = coordinator_->Heartbeat(&ctx, h, &r);
        const auto t1 = LoadClock::now();
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

  int64_t sync_every() const { return config_.outer.sync_every; }
  // Pushes this island's contribution to `round` of every fragment, then reads each update.
  absl::StatusOr<RoundTimes> Round(uint64_t round) {
    step_ = (round + 1) * uint64_t(config_.outer.sync_every);
    std::vector<absl::StatusOr<RoundTimes>> each(fragments_.size(), absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t f = 0; f < fragments_.size(); ++f) {
      threads.emplace_back([&, f] { each[f] = FragmentRound(fragments_[f], round); });
    }
    for (auto& t : threads) t.join();
    RoundTimes all;
    all.first_update = LoadClock::time_point::max();
    for (const auto& t : each) {
      if (!t.ok()) return t.status();
      all.sent = std::max(all.sent, t->sent);
      all.first_update = std::min(all.first_update, t->first_update);
      all.done = std::max(all.done, t->done);
      all.fragments.push_back({t->sent, t->first_update});
      all.bytes_pushed += t->bytes_pushed;
      all.bytes_received += t->bytes_received;
    }
    return all;
  }

  // Cancels the round calls in flight and those to come: another island failed, so the round
  // they wait for cannot complete.
  void CancelRounds() {
    std::lock_guard<std::mutex> lock(calls_mu_);
    rounds_cancelled_ = true;
    for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
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
  // The encoded bytes of one contribution to one round of every fragment.
  uint64_t contribution_bytes() const {
    uint64_t n = 0;
    for (const auto& f : fragments_) {
      n += f.tail.ByteSizeLong();
      for (uint32_t c = 0; c + 1 < f.plan.num_chunks; ++c) n += f.pool[c % f.pool.size()].ByteSizeLong();
    }
    return n;
  }

 private:
  // One fragment's chunks: a few full ones cycled, and the payload's last, shorter one.
  struct Fragment {
    uint32_t index = 0;
    uint64_t elements = 0;
    outer::ChunkPlan plan;
    std::vector<pb::Chunk> pool;
    pb::Chunk tail;
  };

  static constexpr int kControlLane = 0, kDataLane = 1;
  std::shared_ptr<grpc::Channel> Channel(const std::string& address, int lane) const {
    grpc::ChannelArguments args;
    args.SetInt("atoll.loadtest.island", index_);  // a TCP connection of its own
    args.SetInt("atoll.loadtest.lane", lane);
    args.SetMaxReceiveMessageSize(64 << 20);
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }

  // Registers a round's call while it lives: CancelRounds cancels it, at once if it came after.
  class RoundCall {
   public:
    RoundCall(SyntheticIsland* island, grpc::ClientContext* ctx) : island_(island), ctx_(ctx) {
      std::lock_guard<std::mutex> lock(island_->calls_mu_);
      if (island_->rounds_cancelled_) ctx_->TryCancel();  // cancels the call when it starts
      island_->calls_.insert(ctx_);
    }
    ~RoundCall() {
      std::lock_guard<std::mutex> lock(island_->calls_mu_);
      island_->calls_.erase(ctx_);
    }

   private:
    SyntheticIsland* const island_;
    grpc::ClientContext* const ctx_;
  };

  void Prepare(grpc::ClientContext* ctx, double timeout_s) const {
    ctx->AddMetadata(kAuthMetadata, "Bearer " + token_);
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(int64_t(timeout_s * 1000)));
  }

  // What an island trains in the round: its steps (the schedule's; H in async mode) x the tokens
  // of a step, as the service bounds the claim.
  uint64_t RoundTokens(uint32_t fragment, uint64_t round) const {
    const auto& schedule = join_.schedule();
    uint64_t steps = schedule.sync_every();
    if (!schedule.async()) {
      const outer::SyncSchedule s(int(schedule.sync_every()), int(schedule.num_fragments()),
                                  outer::PhasesOf(schedule));
      steps = uint64_t(s.DueStep(int(fragment), round) - s.RoundStart(int(fragment), round));
    }
    return steps * config_.tokens_per_rank_step();
  }

  absl::StatusOr<RoundTimes> FragmentRound(const Fragment& f, uint64_t round) {
    RoundTimes t;
    pb::OuterSync::Stub& stub = *sync_[f.index % sync_.size()];
    {
      grpc::ClientContext ctx;
      Prepare(&ctx, config_.outer.round_timeout_s);
      const RoundCall push(this, &ctx);
      pb::PushResponse response;
      auto writer = stub.Push(&ctx, &response);
      for (uint32_t c = 0; c < f.plan.num_chunks; ++c) {
        const bool tail = c + 1 == f.plan.num_chunks;
        pb::PushRequest m;
        *m.mutable_chunk() = tail ? f.tail : f.pool[(c + uint32_t(index_)) % f.pool.size()];
        auto* h = m.mutable_chunk()->mutable_header();
        h->set_island_id(join_.island_id());
        h->set_round(round);
        h->set_offset(uint64_t(c) * f.plan.per_chunk);
        h->set_chunk_index(c);
        m.set_tokens(RoundTokens(f.index, round));
        if (c == 0) m.set_session(join_.session());
        t.bytes_pushed += m.ByteSizeLong();
        if (!writer->Write(m)) break;
      }
      writer->WritesDone();
      t.sent = LoadClock::now();
      ATL_RETURN_IF_ERROR(FromGrpc(
          writer->Finish(), absl::StrCat("push of round ", round, " of fragment ", f.index)));
    }
    grpc::ClientContext ctx;
    Prepare(&ctx, 2 * config_.outer.round_timeout_s);
    const RoundCall update(this, &ctx);
    pb::UpdateRequest u;
    u.set_run_id(config_.outer.run_id);
    u.set_island_id(join_.island_id());
    u.set_session(join_.session());
    u.set_round(round);
    u.set_fragment(f.index);
    auto reader = stub.AwaitUpdate(&ctx, u);
    pb::UpdateChunk chunk;
    // Elements received per source: the service's encoded update (""), or each contribution of a
    // relayed one (this island holds none of its own: it asks for all).
    std::map<std::string, uint64_t> covered;
    std::vector<std::string> terms;
    bool first = true;
    while (reader->Read(&chunk)) {
      if (first) t.first_update = LoadClock::now();
      first = false;
      if (compression::Checksum(chunk.chunk().data().data(), chunk.chunk().data().size()) !=
          chunk.chunk().xxh64()) {
        return absl::DataLossError(absl::StrCat("an update chunk of round ", round,
                                                " does not match its checksum"));
      }
      if (terms.empty()) {
        for (const auto& term : chunk.recipe().terms()) terms.push_back(term.island_id());
      }
      if (chunk.has_chunk()) covered[chunk.chunk().header().island_id()] += chunk.chunk().header().num_elements();
      t.bytes_received += chunk.ByteSizeLong();
    }
    ATL_RETURN_IF_ERROR(FromGrpc(reader->Finish(), absl::StrCat("update of round ", round)));
    if (terms.empty()) terms.push_back("");
    for (const auto& source : terms) {
      if (covered[source] != f.elements) {
        return absl::DataLossError(absl::StrCat("the update of round ", round, " covers ",
                                                covered[source], " of ", f.elements, " elements",
                                                source.empty() ? "" : " of island " + source));
      }
    }
    t.done = LoadClock::now();
    return t;
  }

  // Random values well inside the service's bounds (pseudo-gradients of about 1e-3 against
  // parameters of about 2e-2).
  absl::StatusOr<Fragment> MakeChunks(uint32_t index, uint64_t elements) {
    const auto codec = config_.outer.wire_codec();
    Fragment f;
    f.index = index;
    f.elements = elements;
    f.plan = outer::PlanChunks(codec, elements);
    uint64_t state = 0x9e3779b97f4a7c15ULL * uint64_t(index_ + 1) + index;
    std::vector<float> values(f.plan.per_chunk);
    auto encode = [&](uint64_t count, uint32_t chunk) -> absl::StatusOr<pb::Chunk> {
      for (uint64_t k = 0; k < count; ++k) {
        state += 0x9e3779b97f4a7c15ULL;  // splitmix64
        uint64_t z = state;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        values[k] = float((double(z >> 11) * 0x1.0p-53 - 0.5) * 4e-3);
      }
      return outer::EncodeChunk({config_.outer.run_id, join_.island_id(), 0, index}, codec,
                                values.data(), 0, count, elements, chunk, f.plan.num_chunks);
    };
    const uint32_t distinct = std::min<uint32_t>(3, std::max<uint32_t>(1, f.plan.num_chunks - 1));
    for (uint32_t i = 0; i < distinct; ++i) {
      ATL_ASSIGN_OR_RETURN(auto c, encode(std::min<uint64_t>(f.plan.per_chunk, elements), 0));
      f.pool.push_back(std::move(c));
    }
    const uint64_t last = elements - uint64_t(f.plan.num_chunks - 1) * f.plan.per_chunk;
    ATL_ASSIGN_OR_RETURN(auto c, encode(last, f.plan.num_chunks - 1));
    f.tail = std::move(c);
    return f;
  }

  const int index_;
  const Config& config_;
  const std::string token_;
  std::unique_ptr<pb::Coordinator::Stub> coordinator_;
  std::vector<std::unique_ptr<pb::OuterSync::Stub>> sync_;  // by shard (one: unsharded)
  pb::JoinResponse join_;
  std::vector<Fragment> fragments_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> step_{0};
  std::thread heartbeat_;
  mutable std::mutex mu_;
  std::vector<Beat> beats_;
  int failed_beats_ = 0;
  std::mutex calls_mu_;
  std::set<grpc::ClientContext*> calls_;  // round calls in flight
  bool rounds_cancelled_ = false;
};
namespace {

// Keeps the islands' rounds in step (a round starts when every island has arrived at it) and
// gathers their times: the last island to finish a round reports it.
// A stop is decided here, once per round, by the last island to arrive, so that every island
// stops before the same round.
class RoundGate {
 public:
  RoundGate(int islands, const std::atomic<bool>* stop,
            std::function<void(int, const RoundTimes&)> on_round)
      : islands_(islands), stop_(stop), on_round_(std::move(on_round)) {}

  // The round's common start, or nullopt when the run stops before it.
  absl::StatusOr<std::optional<LoadClock::time_point>> Start(int round) {
    std::unique_lock<std::mutex> lock(mu_);
    if (++arrived_ == islands_) {
      arrived_ = 0;
      finished_ = 0;
      started_ = round;
      stopped_ = stop_ != nullptr && stop_->load();
      times_ = RoundTimes();
      times_.start = times_.sent = times_.done = LoadClock::now();
      times_.first_update = LoadClock::time_point::max();
      cv_.notify_all();
    }
    cv_.wait(lock, [&] { return started_ >= round || !failure_.ok(); });
    if (!failure_.ok()) return failure_;
    if (stopped_) return std::optional<LoadClock::time_point>();
    return std::optional<LoadClock::time_point>(times_.start);
  }
  bool stopped() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stopped_;
  }

  void Finish(int round, const RoundTimes& t) {
    std::lock_guard<std::mutex> lock(mu_);
    times_.sent = std::max(times_.sent, t.sent);
    times_.first_update = std::min(times_.first_update, t.first_update);
    times_.done = std::max(times_.done, t.done);
    // Across islands, per fragment: the last push and the first update.
    times_.fragments.resize(t.fragments.size());
    for (size_t f = 0; f < t.fragments.size(); ++f) {
      times_.fragments[f].sent = std::max(times_.fragments[f].sent, t.fragments[f].sent);
      times_.fragments[f].first_update =
          std::min(times_.fragments[f].first_update, t.fragments[f].first_update);
    }
    times_.bytes_pushed += t.bytes_pushed;
    times_.bytes_received += t.bytes_received;
    if (++finished_ == islands_) on_round_(round, times_);
  }

  void Fail(const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.ok()) failure_ = s;
    cv_.notify_all();
  }
  absl::Status failure() const {  // the first
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

 private:
  const int islands_;
  const std::atomic<bool>* stop_;
  const std::function<void(int, const RoundTimes&)> on_round_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0, finished_ = 0, started_ = -1;
  bool stopped_ = false;
  RoundTimes times_;
  absl::Status failure_;
};

// One synthetic island's loop: a step counter whose outer step, every H steps, is a round.
class SyntheticLoop : public inner::StepSource, public inner::LoopPart {
 public:
  SyntheticLoop(SyntheticIsland& island, RoundGate& gate, int64_t sync_every)
      : island_(island), gate_(gate), h_(sync_every) {}

  int64_t step() const override { return step_; }
  absl::Status QueueStep() override {
    ++step_;
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<inner::StepStats>> TakeStats() override {
    return std::vector<inner::StepStats>();
  }
  // A round every H steps; a stop before it ends the loop (the last step).
  absl::StatusOr<bool> OuterStep(int64_t t) override {
    if (t % h_ != 0) return false;
    const int round = int(t / h_) - 1;
    ATL_ASSIGN_OR_RETURN(const auto start, gate_.Start(round));
    if (!start) return true;
    auto times = island_.Round(uint64_t(round));
    if (!times.ok()) {
      gate_.Fail(times.status());
      return times.status();
    }
    times->start = *start;
    gate_.Finish(round, *times);
    return false;
  }

 private:
  SyntheticIsland& island_;
  RoundGate& gate_;
  const int64_t h_;
  int64_t step_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SyntheticIslands>> SyntheticIslands::Join(
    const Config& config, int count, const std::string& address, const std::string& token,
    double heartbeat_every_s) {
  std::unique_ptr<SyntheticIslands> out(new SyntheticIslands());
  for (int i = 0; i < count; ++i) {
    out->islands_.push_back(std::make_unique<SyntheticIsland>(i, config, address, token));
    ATL_RETURN_IF_ERROR(out->islands_.back()->Join());
    out->islands_.back()->StartHeartbeats(heartbeat_every_s);
  }
  return out;
}

SyntheticIslands::~SyntheticIslands() = default;

absl::Status SyntheticIslands::RunRounds(
    int rounds, const std::atomic<bool>* stop,
    const std::function<void(int, const RoundTimes&)>& on_round) {
  RoundGate gate(int(islands_.size()), stop, on_round);
  const int64_t h = islands_.front()->sync_every();
  std::vector<std::unique_ptr<SyntheticLoop>> loops;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < islands_.size(); ++i) {
    loops.push_back(std::make_unique<SyntheticLoop>(*islands_[i], gate, h));
  }
  for (size_t i = 0; i < islands_.size(); ++i) {
    threads.emplace_back([&, i] {
      const absl::Status status = inner::RunLoop(*loops[i], int64_t(rounds) * h, {loops[i].get()});
      if (status.ok()) return;
      // The others' rounds cannot complete without this island: they end now (CANCELLED), not
      // at their calls' deadlines, and the first failure is the run's.
      gate.Fail(status);
      for (auto& island : islands_) island->CancelRounds();
    });
  }
  for (auto& t : threads) t.join();
  ATL_RETURN_IF_ERROR(gate.failure());  // every island's failure went to the gate
  if (gate.stopped()) return absl::CancelledError("stopped");
  return absl::OkStatus();
}

absl::Status SyntheticIslands::Leave(const std::string& log_hint) {
  for (auto& island : islands_) island->StopHeartbeats();
  for (auto& island : islands_) {
    ATL_RETURN_IF_ERROR(island->Leave());
    if (const int failed = island->failed_beats(); failed > 0) {
      return absl::InternalError(absl::StrCat(failed, " heartbeats failed; see ", log_hint));
    }
  }
  return absl::OkStatus();
}

std::vector<Beat> SyntheticIslands::Heartbeats() const {
  std::vector<Beat> all;
  for (const auto& island : islands_) {
    const auto beats = island->beats();
    all.insert(all.end(), beats.begin(), beats.end());
  }
  return all;
}

uint64_t SyntheticIslands::contribution_bytes() const {
  return islands_.front()->contribution_bytes();
}

}  // namespace atl
