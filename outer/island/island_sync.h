// The island side of DiLoCo's outer step, transport-independent and torch-free: it keeps the
// island's copy of the global parameters (flat fp32), turns the local parameters after H inner
// steps into a pseudo-gradient, pushes it, applies the committed outer update and checks that its
// copy is bit-identical to the service's (resyncing with a full fetch when it is not).
//
// A rank of a sharded island carries only the ranges of the fragment it owns: its copy, its
// pseudo-gradient, its push (one stream holding its ranges), the updates it receives and the hashes
// it checks are of those ranges. No rank ever holds a whole fragment.
//
// Payloads stream: a push encodes each chunk as the transport sends it (the pseudo-gradient is
// never held whole, encoded or not), an update is applied chunk by chunk as it arrives, a state
// transfer lands piece by piece. With a transport of several connections each of these is cut
// into parts sent at once, one per connection: the bytes on the wire are the same as with one.
//
// Threading: one IslandSync belongs to one thread at a time.
#ifndef ATOLL_OUTER_ISLAND_ISLAND_SYNC_H_
#define ATOLL_OUTER_ISLAND_ISLAND_SYNC_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "outer/island/device_copy.h"
#include "outer/base/payload.h"
#include "outer/base/transport.h"

namespace atl::outer {

// Elements of each push decoded again to measure its quantization error.
inline constexpr uint64_t kErrorSampleElements = uint64_t(1) << 16;

struct RoundOutcome {
  uint64_t round = 0;           // the round just finished
  bool resynced = false;        // the global copy was replaced by a full fetch
  std::string resync_reason;
  // Sync, host path: the push was refused, its round having gone on without it (too stale to be
  // folded in): the global copy it was made from, for the island to carry its steps onto the
  // new one (OuterStepHook). Empty otherwise.
  std::vector<float> refused_from;
  uint32_t contributors = 0;
  uint64_t bytes_sent = 0;      // serialized payload bytes
  uint64_t bytes_received = 0;
  uint64_t elements = 0;        // parameters the round carried each way (this rank's ranges)
  double push_s = 0;            // encode + push
  double wait_s = 0;            // waiting for the round to commit + receiving the update
  uint32_t pushed_again = 0;    // the service lost the push (it resumed) and was given it again
  // Relative RMS error of the pushed encoding against the exact pseudo-gradient (on a sample of
  // kErrorSampleElements; 0 for fp32).
  double quantization_error = 0;
  // Async mode (from the service's answer to the push).
  uint64_t version = 0;         // the global copy's version after catching up
  uint32_t staleness = 0;
  uint32_t sync_every = 0;      // the island's H from now on (0: unchanged)
  uint64_t tokens_committed = 0;
  bool budget_reached = false;
  // Sync with auto-tune: the tau the service chose for the island's next pushes (-1: none).
  int tau = -1;
  // Sync: the push came after its round committed and was folded into round `version` (its
  // staleness in `staleness`); the island applied its own round's update as usual.
  bool late = false;
  double behind_s = 0;  // late: seconds since its round committed (the island's phase lag)
  // Moments (outer.moment_sync_every; outer/island/moment_sync.h): the average this rank loads
  // (empty: none this round), or why there is none.
  std::vector<float> moments;
  std::string moment_note;
};

// Who an island is to the service: its id and the session credential of its current membership,
// replaced when it rejoins. Shared by the island's threads (pushes, heartbeats, leave).
class IslandIdentity {
 public:
  IslandIdentity(std::string island_id, std::string session)
      : island_id_(std::move(island_id)), session_(std::move(session)) {}
  const std::string& island_id() const { return island_id_; }
  std::string session() const {
    std::lock_guard<std::mutex> lock(mu_);
    return session_;
  }
  void set_session(std::string session) {
    std::lock_guard<std::mutex> lock(mu_);
    session_ = std::move(session);
  }

 private:
  const std::string island_id_;
  mutable std::mutex mu_;
  std::string session_;
};

struct IslandSyncOptions {
  compression::CodecSpec codec = {compression::Codec::kFp32, 0};  // of pseudo-gradients
  // Error feedback: what the codec dropped from a pseudo-gradient is added to the next one. The
  // residual stays on the island; it is reset when a contribution is refused (the round went on
  // without it and the island resyncs).
  bool error_feedback = false;
  // beta: the residual is scaled by it before the next pseudo-gradient is added (SparseLoCo's
  // accumulator e <- beta e + delta; 1: plain error feedback).
  float error_feedback_decay = 1.0f;
  // Stochastic rounding of pseudo-gradients (unbiased; see compression/codec.h). Each round and
  // fragment draws from its own stream derived from `seed`, which should differ between islands.
  bool stochastic_rounding = false;
  uint64_t seed = 0;
  size_t chunk_bytes = kDefaultChunkBytes;
  // Lanes: with a transport of several connections, a push, an update and a state transfer are cut
  // into that many parts (whole chunks, ranges or pieces) sent at once, one per connection.
  // Full-state transfers go in pieces of this many bytes, each its own request: a transfer cut by
  // the network resumes at the piece where it stopped.
  size_t fetch_piece_bytes = size_t(16) << 20;
  int retries = 4;  // per piece, push or update: transient failures (UNAVAILABLE, DATA_LOSS)
  uint32_t fragment = 0;  // which fragment this IslandSync carries
  // The ranges [begin, end) of the fragment this rank owns, ascending; empty: the whole fragment.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  // False: this rank carries nothing of the fragment (a replica of ranks that do: they push and
  // receive, and hand it the result inside the island). Then nothing goes over the network; the
  // round only moves on with the island's (SyncRound: the next, CatchUp: the one named).
  bool carried = true;
  // Async mode: the push is applied at once; the island then applies every version since the one
  // it started from, in order, and checks each hash, so its copy stays bit-identical.
  bool async = false;
  // A hostile island, rehearsed (outer.fault): its pseudo-gradient (host path) negated, or replaced
  // by Gaussian noise of the same norm, chunk by chunk, before it is encoded.
  enum class Fault { kNone, kSignFlip, kNoise };
  Fault fault = Fault::kNone;
  uint64_t fault_rounds = 0;  // pushes to rounds before this one misbehave (0: all)
};

class IslandSync {
 public:
  // `fragment_elements`: of the whole fragment; the copy holds the ranges of options.ranges.
  IslandSync(Transport* transport, std::string run_id,
             std::shared_ptr<const IslandIdentity> identity, uint64_t fragment_elements,
             IslandSyncOptions options = {});

  // Replaces the global copy with the service's current state, piece by piece (resuming a cut
  // transfer at the piece where it stopped, re-requesting corrupted pieces), verifying its hash;
  // starts over if the state changed in between. All or nothing.
  absl::Status FetchGlobal();
  // Takes `values` (the whole fragment) as the global copy at `round` instead of fetching it, when
  // their ParamsHash is `hash`, the service's: a first joiner's own seeded initial parameters. Else
  // FAILED_PRECONDITION and nothing changes (the caller fetches).
  absl::Status Adopt(std::vector<float> values, uint64_t round, uint64_t hash);
  // After H inner steps: pushes global - local (weighted by `tokens`, the whole island's), waits
  // for the round to commit, applies the outer update to the global copy. On return global() holds
  // the new global parameters, which the caller loads into its model. `local` holds the owned
  // ranges, concatenated. `steps_per_s` reports the island's inner throughput (async DyLU),
  // `step` its inner step (the service keeps the newest for the island's restart).
  absl::StatusOr<RoundOutcome> SyncRound(const std::vector<float>& local, uint64_t tokens,
                                         double steps_per_s = 0, uint64_t step = 0);
  // The same with a device copy: the pseudo-gradient it captured (DeviceCopy::Capture) is encoded
  // there, and each committed update is applied to it as to the host copy.
  absl::StatusOr<RoundOutcome> SyncRoundOnDevice(uint64_t tokens, double steps_per_s = 0,
                                                 uint64_t step = 0);
  // Sync, host path: pushes global - local as SyncRound does, without waiting for the round to
  // commit (an island that leaves: its last steps count). The global copy does not move.
  absl::StatusOr<pb::PushResponse> Contribute(const std::vector<float>& local, uint64_t tokens,
                                              uint64_t step);
  // The device copy this fragment's rounds keep equal to global() (outer/island/device_copy.h); set before
  // the first fetch, owned by the model, outliving this IslandSync. nullptr: none.
  void set_device_copy(DeviceCopy* copy);

  // Moments (outer.moment_sync_every; outer/service/moment_desk.h). `moments` holds this rank's
  // owned ranges of both channels, channel-major (kMomentChannels x the owned elements), of the
  // optimizer `optimizer` names; they are pushed for `round` (before its pseudo-gradient).
  // Returns the bytes sent. Nothing is sent by a rank that carries nothing.
  absl::StatusOr<uint64_t> PushMoments(const std::string& optimizer,
                                       const std::vector<float>& moments, uint64_t round,
                                       uint64_t step);
  // The service's average of the moments of `round` (0: the newest), as PushMoments lays them
  // out; `*bytes` adds the bytes received. NOT_FOUND none (see MomentDesk::FetchMoments).
  absl::StatusOr<std::vector<float>> FetchMoments(const std::string& optimizer, uint64_t round,
                                                  uint64_t* bytes);

  // Applies the committed rounds (versions) up to `version`, in order, checking every hash; fetches
  // the full state when the service no longer has them. For async islands at the end of a run.
  absl::StatusOr<RoundOutcome> CatchUp(uint64_t version);

  // The owned ranges of the global parameters, concatenated.
  const std::vector<float>& global() const { return global_; }
  const std::vector<std::pair<uint64_t, uint64_t>>& ranges() const { return ranges_; }
  uint64_t round() const { return round_; }
  bool carried() const { return options_.carried; }
  uint64_t global_hash() const;
  // Total bytes of full-state fetches (joins and resyncs).
  uint64_t fetched_bytes() const { return fetched_bytes_; }
  // The error-feedback residual of the owned ranges (as of the last accepted push); read while
  // no push runs, or through ResidualSnapshot, which any thread may call (and which reads the
  // device copy's residual when there is one: residual() is the host path's).
  const std::vector<float>& residual() const { return residual_; }
  std::vector<float> ResidualSnapshot() const;
  // A checkpoint's residual (owned elements, concatenated), before the first push of a resumed
  // island. INVALID_ARGUMENT when the size is not the owned elements'.
  absl::Status RestoreResidual(std::vector<float> residual);
  uint64_t fragment_elements() const { return fragment_elements_; }
  uint32_t fragment() const { return options_.fragment; }
  // Whether the fragment has a residual to checkpoint (error feedback; on the host or the device).
  bool keeps_residual() const { return options_.error_feedback; }
  // The goodput to the service this island measured (reported with each push; 0: unknown). Set
  // while no push is in flight.
  void set_link_bps(double bps) { link_bps_ = bps; }

 private:
  // Receives the update of `round` (blocking until it commits), applies it to the global copy and
  // checks the result against the service's hash. FAILED_PRECONDITION when the service no longer
  // has it (or did not know this rank's range), DATA_LOSS on a hash mismatch: the caller resyncs.
  absl::Status ApplyRound(uint64_t round, RoundOutcome& out);
  // Encodes and pushes global - local on every lane at once (each retried on transient failures);
  // the service's answer, or the first lane's error.
  absl::StatusOr<RoundOutcome> Round(const std::vector<float>* local, uint64_t tokens,
                                     double steps_per_s, uint64_t step);
  // Takes the service's answer to a push into `out`; returns the round (version) to apply up to.
  uint64_t TakeAnswer(const pb::PushResponse& pushed, RoundOutcome& out) const;
  // `local` null: the device copy makes the pseudo-gradient.
  absl::StatusOr<pb::PushResponse> PushContribution(const std::vector<float>* local,
                                                    uint64_t tokens, double steps_per_s,
                                                    uint64_t step, RoundOutcome& out);
  // One element range [begin, end) of the fragment held at owned offset `at`.
  struct Span {
    uint64_t at = 0, begin = 0, end = 0;
  };
  // The chunks of a push, cut into the lanes' parts: whole chunks of a whole fragment, whole
  // ranges of a rank's (the service knows a rank's ranges by the parts they arrive in).
  std::vector<std::vector<Span>> PlanPush() const;
  // ApplyRound's steps. What is received: each owned range with its own hash, or (a whole
  // fragment on several lanes: `split`) parts on whole scale blocks, all checked at the end
  // against the fragment's hash.
  std::vector<Span> PlanReceive(bool split) const;
  struct Received;
  // Part p of the update into next[p.at, ...), retrying transient failures, its range's hash
  // checked unless split.
  void ReceivePart(const Span& p, uint64_t round, bool split, int lane, std::vector<float>& next,
                   Received& got);
  pb::UpdateRequest UpdateRequestFor(const Span& p, uint64_t round, bool split,
                                     bool holds_own) const;
  // One attempt at ReceivePart: the range's hash as the service sent it.
  absl::Status ReceiveOnce(const pb::UpdateRequest& request, const Span& p, int lane,
                           std::vector<float>& next, Received& got, uint64_t* range_hash);
  absl::Status CheckSplitHash(const std::vector<Received>& received, uint64_t round,
                              const std::vector<float>& next) const;
  // PushContribution's steps (outer/island/island_sync_push.cc): one chunk of a lane's part,
  // encoded (and its residual and error noted); the lanes' answers combined into the push's.
  struct PushPlan;
  struct PushLane;
  absl::StatusOr<pb::Chunk> EncodePushChunk(const PushPlan& plan, const Span& c, uint32_t index,
                                            uint32_t count, std::vector<float>& delta,
                                            std::vector<float>& decoded, PushLane& lane);
  // options_.fault applied to one chunk's pseudo-gradient.
  void Misbehave(const PayloadId& id, uint32_t chunk, std::vector<float>& delta) const;
  absl::StatusOr<pb::PushResponse> TakeAnswers(std::vector<PushLane>& lanes, bool keep_own,
                                               RoundOutcome& out);
  // PushContribution's: what was pushed (its lanes' chunks), kept as this round's own
  // contribution, which a relayed update leaves out (outer/base/update_recipe.h).
  void KeepOwn(std::vector<EncodedChunk> sent);
  // PushContribution's: one push of a lane, retried on transient failures.
  absl::StatusOr<pb::PushResponse> PushRetrying(const std::function<PushSource()>& source,
                                                int lane);
  // Fetches elements [offset, offset + count) into out, retrying transient failures; sets
  // *changed when the state it got is not that of the other pieces (a round committed).
  struct FetchProgress;
  absl::Status FetchPiece(uint64_t offset, uint64_t count, float* out, int lane,
                          FetchProgress& progress);
  int lanes() const { return std::max(1, transport_->connections()); }
  // Fetches elements [begin, end) of the fragment into values[0, end - begin), piece by piece,
  // each verified; the round and fragment hash the pieces were served at.
  absl::Status FetchRange(uint64_t begin, uint64_t end, float* values, uint64_t* round,
                          uint64_t* hash, bool* changed, uint64_t* bytes);
  bool whole() const { return ranges_.size() == 1 && ranges_[0].first == 0 && ranges_[0].second == fragment_elements_; }

  Transport* transport_;
  std::string run_id_, island_id_;
  std::shared_ptr<const IslandIdentity> identity_;
  uint64_t fragment_elements_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;
  uint64_t n_;  // elements owned
  IslandSyncOptions options_;
  mutable std::mutex residual_mu_;  // guards residual_ against snapshots (checkpoints)
  std::vector<float> residual_;  // error feedback
  std::vector<float> next_residual_;  // written by a push, kept when it is accepted
  std::vector<float> global_;
  // What this rank pushed in round own_round_ (sparse codecs: a relayed update leaves it out).
  EncodedPayload own_;
  uint64_t own_round_ = UINT64_MAX;
  DeviceCopy* device_ = nullptr;
  uint64_t round_ = 0;
  double link_bps_ = 0;
  uint64_t fetched_bytes_ = 0;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_ISLAND_ISLAND_SYNC_H_
