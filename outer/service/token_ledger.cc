#include "outer/service/token_ledger.h"

#include <algorithm>

#include "absl/numeric/int128.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace atl::outer {

uint64_t TokenAccount::refused_total() const {
  uint64_t n = 0;
  for (const auto& [reason, tokens] : refused) n = tokens > UINT64_MAX - n ? UINT64_MAX : n + tokens;
  return n;
}

uint64_t TokenAccount::lost() const {
  const absl::uint128 accounted =
      absl::uint128(on_time) + stale + recomputed + refused_total();
  return accounted >= trained ? 0 : trained - absl::Uint128Low64(accounted);
}

void TokenAccount::Add(const TokenAccount& o) {
  trained += o.trained;
  on_time += o.on_time;
  stale += o.stale;
  recomputed += o.recomputed;
  for (const auto& [reason, tokens] : o.refused) refused[reason] += tokens;
}

std::string RefusalReason(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kFailedPrecondition:
      return absl::StrContains(s.message(), "stale") || absl::StrContains(s.message(), "committed")
                 ? "stale"
                 : "failed precondition";
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return "not a member";
    case absl::StatusCode::kAlreadyExists:
      return "duplicate";
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kDataLoss:
      return "invalid";
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDeadlineExceeded:
      return "unavailable";
    default:
      return absl::StatusCodeToString(s.code());
  }
}

namespace {

// Claims are a caller's word: sums of them saturate instead of wrapping.
uint64_t AddSaturating(uint64_t a, uint64_t b) { return b > UINT64_MAX - a ? UINT64_MAX : a + b; }

}  // namespace

TokenLedger::Island* TokenLedger::Find(const std::string& island) {
  auto it = islands_.find(island);
  if (it != islands_.end()) return &it->second;
  if (islands_.size() >= kMaxIslands) return nullptr;
  return &islands_[island];
}

void TokenLedger::Trained(const std::string& name, uint64_t process, uint64_t tokens_trained) {
  Island* island = Find(name);
  if (island == nullptr) return;
  if (!island->seen.count(process)) {
    if (island->processes.size() >= kMaxProcesses) {
      // Fold the oldest process in: it is long gone.
      auto oldest = std::min_element(island->seen.begin(), island->seen.end(),
                                     [](const auto& a, const auto& b) { return a.second < b.second; });
      const Process& p = island->processes[oldest->first];
      island->account.trained += p.trained;
      island->account.recomputed += p.trained > p.pushed ? p.trained - p.pushed : 0;
      island->processes.erase(oldest->first);
      island->seen.erase(oldest);
    }
    island->seen[process] = ++island->order;
  }
  Process& p = island->processes[process];
  p.trained = std::max(p.trained, tokens_trained);
  island->latest = process;
}

void TokenLedger::Pushed(const std::string& name, uint64_t round, uint64_t tokens) {
  Island* island = Find(name);
  if (island == nullptr) return;
  if (auto it = island->refused_rounds.find(round); it != island->refused_rounds.end()) {
    // The refused contribution, pushed again (after a rejoin): its tokens were counted as pushed
    // at the refusal; this one's replace them.
    const uint64_t was = it->second.second;
    uint64_t& refused = island->account.refused[it->second.first];
    refused -= std::min(refused, was);
    if (refused == 0) island->account.refused.erase(it->second.first);
    island->refused_rounds.erase(it);
    uint64_t& pushed = island->processes[island->latest].pushed;
    pushed = AddSaturating(pushed - std::min(pushed, was), tokens);
    return;
  }
  uint64_t& pushed = island->processes[island->latest].pushed;
  pushed = AddSaturating(pushed, tokens);
  if (!island->seen.count(island->latest)) island->seen[island->latest] = ++island->order;
}

void TokenLedger::Refused(const std::string& name, uint64_t round, const std::string& reason,
                          uint64_t tokens) {
  // Only islands the ledger knows (a member's heartbeats made them): a refused caller's name and
  // claim are not taken on trust.
  auto it = islands_.find(name);
  if (it == islands_.end()) return;
  Island* island = &it->second;
  if (island->refused_rounds.count(round)) return;  // the same contribution refused again
  Pushed(name, round, tokens);
  uint64_t& refused = island->account.refused[reason];
  refused = AddSaturating(refused, tokens);
  constexpr size_t kRefusedRounds = 16;
  island->refused_rounds[round] = {reason, tokens};
  if (island->refused_rounds.size() > kRefusedRounds) island->refused_rounds.erase(island->refused_rounds.begin());
}

void TokenLedger::Dropped(const std::string& name, const std::string& reason, uint64_t tokens) {
  Island* island = Find(name);
  if (island != nullptr) island->account.refused[reason] += tokens;
}

void TokenLedger::Committed(const std::string& name, uint64_t tokens, bool stale) {
  Island* island = Find(name);
  if (island == nullptr) return;
  uint64_t& committed = stale ? island->account.stale : island->account.on_time;
  committed = AddSaturating(committed, tokens);
}

TokenAccount TokenLedger::AccountOf(const Island& island) const {
  TokenAccount a = island.account;
  for (const auto& [id, p] : island.processes) {
    // Heartbeats lag the steps by up to a heartbeat: a process trained at least what it pushed.
    const uint64_t trained = std::max(p.trained, p.pushed);
    a.trained = AddSaturating(a.trained, trained);
    // A process that is not the island's latest has died (or ended): what it trained past its
    // contributions is trained again by the one after it.
    if (id != island.latest) a.recomputed = AddSaturating(a.recomputed, trained - p.pushed);
  }
  return a;
}

std::map<std::string, TokenAccount> TokenLedger::Totals() const {
  std::map<std::string, TokenAccount> out;
  for (const auto& [name, island] : islands_) out[name] = AccountOf(island);
  return out;
}

std::map<std::string, TokenAccount> TokenLedger::TakeSlice() {
  std::map<std::string, TokenAccount> totals = Totals(), slice;
  for (const auto& [name, now] : totals) {
    const TokenAccount& before = taken_[name];
    TokenAccount d;
    d.trained = now.trained - std::min(now.trained, before.trained);
    d.on_time = now.on_time - std::min(now.on_time, before.on_time);
    d.stale = now.stale - std::min(now.stale, before.stale);
    d.recomputed = now.recomputed - std::min(now.recomputed, before.recomputed);
    for (const auto& [reason, tokens] : now.refused) {
      auto it = before.refused.find(reason);
      const uint64_t was = it == before.refused.end() ? 0 : it->second;
      if (tokens > was) d.refused[reason] = tokens - was;
    }
    if (!d.empty()) slice[name] = std::move(d);
  }
  taken_ = std::move(totals);
  return slice;
}

namespace {

void SaveAccount(const TokenAccount& a, pb::LedgerIsland* out, bool taken) {
  if (taken) {
    out->set_taken_trained(a.trained);
    out->set_taken_on_time(a.on_time);
    out->set_taken_stale(a.stale);
    out->set_taken_recomputed(a.recomputed);
  } else {
    out->set_trained(a.trained);
    out->set_on_time(a.on_time);
    out->set_stale(a.stale);
    out->set_recomputed(a.recomputed);
  }
  for (const auto& [reason, tokens] : a.refused) {
    auto* c = taken ? out->add_taken_refused() : out->add_refused();
    c->set_name(reason);
    c->set_value(int64_t(std::min<uint64_t>(tokens, INT64_MAX)));
  }
}

absl::StatusOr<std::map<std::string, uint64_t>> RefusedOf(
    const google::protobuf::RepeatedPtrField<pb::StateCounter>& in, const std::string& island) {
  std::map<std::string, uint64_t> out;
  for (const auto& c : in) {
    if (c.value() < 0 || c.name().empty() || c.name().size() > 64 || out.count(c.name())) {
      return absl::InvalidArgumentError(absl::StrCat("service state: the ledger of island '",
                                                     island, "' has a malformed refusal"));
    }
    out[c.name()] = uint64_t(c.value());
  }
  return out;
}

}  // namespace

void TokenLedger::Save(google::protobuf::RepeatedPtrField<pb::LedgerIsland>* out) const {
  for (const auto& [name, island] : islands_) {
    pb::LedgerIsland* l = out->Add();
    l->set_island(name);
    SaveAccount(island.account, l, /*taken=*/false);
    for (const auto& [id, p] : island.processes) {
      auto* lp = l->add_processes();
      lp->set_process(id);
      lp->set_trained(p.trained);
      lp->set_pushed(p.pushed);
      const auto seen = island.seen.find(id);
      lp->set_order(seen == island.seen.end() ? 0 : seen->second);
    }
    l->set_latest(island.latest);
    l->set_order(island.order);
    if (auto t = taken_.find(name); t != taken_.end()) SaveAccount(t->second, l, /*taken=*/true);
  }
}

absl::Status TokenLedger::Restore(const google::protobuf::RepeatedPtrField<pb::LedgerIsland>& in) {
  if (size_t(in.size()) > kMaxIslands) {
    return absl::InvalidArgumentError("service state: the ledger names too many islands");
  }
  std::map<std::string, Island> islands;
  std::map<std::string, TokenAccount> taken;
  for (const auto& l : in) {
    if (l.island().empty() || islands.count(l.island()) ||
        size_t(l.processes_size()) > kMaxProcesses) {
      return absl::InvalidArgumentError(
          absl::StrCat("service state: a malformed ledger entry (island '", l.island(), "')"));
    }
    Island& island = islands[l.island()];
    island.account = {l.trained(), l.on_time(), l.stale(), l.recomputed(), {}};
    auto refused = RefusedOf(l.refused(), l.island());
    if (!refused.ok()) return refused.status();
    island.account.refused = *std::move(refused);
    for (const auto& p : l.processes()) {
      island.processes[p.process()] = {p.trained(), p.pushed()};
      island.seen[p.process()] = p.order();
    }
    island.latest = l.latest();
    island.order = l.order();
    TokenAccount t{l.taken_trained(), l.taken_on_time(), l.taken_stale(), l.taken_recomputed(), {}};
    auto taken_refused = RefusedOf(l.taken_refused(), l.island());
    if (!taken_refused.ok()) return taken_refused.status();
    t.refused = *std::move(taken_refused);
    taken[l.island()] = std::move(t);
  }
  islands_ = std::move(islands);
  taken_ = std::move(taken);
  return absl::OkStatus();
}

}  // namespace atl::outer
