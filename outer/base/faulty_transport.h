// A Transport wrapper that injects faults, for tests and failure rehearsals: calls that fail as if
// the network dropped them, delays, corrupted chunk bytes (each direction), state transfers cut
// after a number of bytes, and a faulty island's pseudo-gradients (scaled or sign-flipped, then
// re-encoded with valid checksums: nothing on the wire tells them apart from healthy ones).
// Deterministic for a given seed.
#ifndef ATOLL_OUTER_BASE_FAULTY_TRANSPORT_H_
#define ATOLL_OUTER_BASE_FAULTY_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <random>

#include "absl/time/time.h"
#include "outer/base/transport.h"

namespace atl::outer {

struct Faults {
  double drop = 0;          // probability that a call fails with UNAVAILABLE before reaching the service
  absl::Duration delay;     // added to every call
  double corrupt = 0;       // probability that a payload chunk (push, update or state) has a byte flipped
  // > 0: once, the state transfer that crosses this many bytes (counted over all transfers) fails
  // with UNAVAILABLE: a cut connection.
  uint64_t cut_after_bytes = 0;
  // != 1: every pushed pseudo-gradient is multiplied by this (-1: sign-flipped) before it is sent.
  float scale_pushes = 1;
  uint64_t seed = 1;
};

class FaultyTransport : public Transport {
 public:
  FaultyTransport(Transport* inner, Faults faults);

  absl::StatusOr<pb::JoinResponse> Join(const pb::JoinRequest& r) override;
  absl::Status Leave(const pb::LeaveRequest& r) override;
  absl::StatusOr<pb::HeartbeatResponse> Heartbeat(const pb::HeartbeatRequest& r) override;
  int connections() const override { return inner_->connections(); }
  void Route(const pb::JoinResponse& joined) override { inner_->Route(joined); }
  void Cancel() override { inner_->Cancel(); }
  absl::StatusOr<pb::PushResponse> Push(const PushSource& source, int lane) override;
  absl::Status AwaitUpdate(const pb::UpdateRequest& r, const ChunkSink<pb::UpdateChunk>& sink,
                           int lane) override;
  absl::Status FetchState(const pb::FetchStateRequest& r, const ChunkSink<pb::StateChunk>& sink,
                          int lane) override;

  // Faults injected so far.
  uint64_t dropped() const { return dropped_; }
  uint64_t corrupted() const { return corrupted_; }
  uint64_t cut() const { return cut_; }

 private:
  // Sleeps the delay; true when this call is to be dropped.
  bool Drop();
  bool Corrupt(pb::Chunk& chunk);
  void Scale(pb::Chunk& chunk) const;

  Transport* inner_;
  Faults faults_;
  std::mutex mu_;
  std::mt19937_64 rng_;
  std::atomic<uint64_t> dropped_{0}, corrupted_{0}, cut_{0};
  uint64_t state_bytes_ = 0;  // state bytes delivered (under mu_)
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_FAULTY_TRANSPORT_H_
