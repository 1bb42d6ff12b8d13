// Where each island's trained tokens went (fragment 0's contributions: each step's tokens once):
// committed on time, committed stale (folded into a later round, outer.max_staleness), refused
// (by reason), or trained again after a restart (what a killed process trained past its last
// contribution). The service's one account of a run's goodput: rounds.jsonl carries each commit's
// slice of it, the status page and Prometheus the totals per island.
//
// Trained tokens are what each island process reports in its heartbeats (IslandTelemetry:
// tokens_trained, with a process id), so a killed process's last heartbeat bounds what it is
// known to have trained: the steps it trained after that (under one heartbeat) are not counted.
#ifndef ATOLL_OUTER_SERVICE_TOKEN_LEDGER_H_
#define ATOLL_OUTER_SERVICE_TOKEN_LEDGER_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "atoll/v1/service_state.pb.h"

namespace atl::outer {

namespace pb = ::atollpb::v1;

// trained = on_time + stale + recomputed + refused + lost, per island: lost is what no other
// column holds (steps a loss-spike guard dropped, a claim refused as invalid, the steps of a
// contribution still waiting for its round).
struct TokenAccount {
  uint64_t trained = 0;     // by every process of the island, recomputed steps included
  uint64_t on_time = 0;     // in contributions committed in their own round
  uint64_t stale = 0;       // in contributions folded into a later round
  uint64_t recomputed = 0;  // trained by a process that died, past its last contribution
  std::map<std::string, uint64_t> refused;  // by reason (RefusalReason)
  bool empty() const { return trained + on_time + stale + recomputed == 0 && refused.empty(); }
  uint64_t refused_total() const;
  // trained less every other column (0 where they exceed it: claims past what heartbeats said).
  uint64_t lost() const;
  void Add(const TokenAccount& other);
};

// A refused push's reason, from its status: "stale" (its round committed long ago), "not a
// member" (dropped, or another session), "duplicate", "invalid" (values, norm, claim, shape),
// "unavailable" (the service could not take it then), or the status code's name.
std::string RefusalReason(const absl::Status& status);

// Not thread-safe: the service calls it under its lock. Bounded: at most kMaxIslands names and
// kMaxProcesses processes per name (the oldest process's figures are folded into the name's).
class TokenLedger {
 public:
  static constexpr size_t kMaxIslands = 4096;
  static constexpr size_t kMaxProcesses = 64;

  // A heartbeat: process `process` of `island` has trained `tokens_trained` tokens in all.
  void Trained(const std::string& island, uint64_t process, uint64_t tokens_trained);
  // A contribution to round `round` of fragment 0 was recorded (`tokens`: its claim), refused, or
  // committed. One recorded after a refusal of the same round (pushed again after a rejoin) takes
  // its tokens back from the refused.
  void Pushed(const std::string& island, uint64_t round, uint64_t tokens);
  void Refused(const std::string& island, uint64_t round, const std::string& reason, uint64_t tokens);
  // A recorded contribution the commit left out (its combination would not be finite).
  void Dropped(const std::string& island, const std::string& reason, uint64_t tokens);
  void Committed(const std::string& island, uint64_t tokens, bool stale);

  // Per island, since the service started.
  std::map<std::string, TokenAccount> Totals() const;
  // Per island, what changed since the previous call (empty accounts left out).
  std::map<std::string, TokenAccount> TakeSlice();

  // The durable state's part (every island, its processes, and the previous slice's base), and
  // back: a restarted service goes on counting where it stopped, its slices continuing the
  // ones rounds.jsonl holds. Restore replaces everything (a malformed entry: INVALID_ARGUMENT, and
  // nothing changed).
  void Save(google::protobuf::RepeatedPtrField<pb::LedgerIsland>* out) const;
  absl::Status Restore(const google::protobuf::RepeatedPtrField<pb::LedgerIsland>& in);

 private:
  struct Process {
    uint64_t trained = 0;  // as its latest heartbeat said
    uint64_t pushed = 0;   // tokens of its contributions recorded or refused
  };
  struct Island {
    std::map<uint64_t, Process> processes;
    uint64_t latest = 0;   // the process heard from last
    uint64_t order = 0;    // processes by first heartbeat: the latest's
    std::map<uint64_t, uint64_t> seen;  // process -> the order it was first heard in
    TokenAccount account;  // trained and recomputed: of processes folded in (kMaxProcesses)
    std::map<uint64_t, std::pair<std::string, uint64_t>> refused_rounds;  // the latest few
  };
  Island* Find(const std::string& island);
  TokenAccount AccountOf(const Island& island) const;

  std::map<std::string, Island> islands_;
  std::map<std::string, TokenAccount> taken_;  // Totals() at the previous TakeSlice()
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_TOKEN_LEDGER_H_
