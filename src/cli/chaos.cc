#include "src/cli/chaos.h"

#include <signal.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "compression/status_macros.h"
#include "src/observe/metrics.h"
#include <nlohmann/json.hpp>

namespace atl {
namespace {

absl::Status ChaosError(const std::string& part, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--chaos: '", part, "' ", why,
      " (expected seed=N,every=SECONDS,kinds=kill+stop,down=SECONDS,reference=RUN_DIR, each "
      "optional)"));
}

}  // namespace

absl::StatusOr<ChaosSpec> ParseChaos(const std::string& text) {
  ChaosSpec spec;
  const std::vector<std::string> parts = absl::StrSplit(text, ',', absl::SkipEmpty());
  for (const std::string& part : parts) {
    const std::vector<std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (kv.size() != 2) return ChaosError(part, "is not KEY=VALUE");
    const std::string& key = kv[0];
    const std::string& value = kv[1];
    if (key == "seed") {
      if (!absl::SimpleAtoi(value, &spec.seed)) return ChaosError(part, "is not a whole number");
    } else if (key == "every" || key == "down") {
      double v = 0;
      if (!absl::SimpleAtod(value, &v) || !std::isfinite(v) || v < 1 || v > 1e6) {
        return ChaosError(part, "must be seconds in [1, 1e6]");
      }
      (key == "every" ? spec.every_s : spec.down_s) = v;
    } else if (key == "reference") {
      if (value.empty()) return ChaosError(part, "names no run directory");
      spec.reference = value;
    } else if (key == "kinds") {
      spec.kinds.clear();
      const std::vector<std::string> names = absl::StrSplit(value, '+');
      for (const std::string& k : names) {
        if (k == "kill") {
          spec.kinds.push_back(ChaosKind::kKill);
        } else if (k == "stop") {
          spec.kinds.push_back(ChaosKind::kStop);
        } else {
          return ChaosError(part, absl::StrCat("names '", k, "', not kill or stop"));
        }
      }
    } else {
      return ChaosError(part, "is not a key of it");
    }
  }
  return spec;
}

ChaosPlan::ChaosPlan(const ChaosSpec& spec, int islands)
    : spec_(spec), islands_(std::max(1, islands)), rng_(spec.seed) {}

ChaosPlan::Failure ChaosPlan::Next() {
  // Drawn from the raw 64-bit stream with explicit arithmetic: the same on every library.
  auto uniform = [this] { return double(rng_() >> 11) * 0x1.0p-53; };
  t_ += -spec_.every_s * std::log1p(-uniform());
  Failure f;
  f.at_s = t_;
  f.island = int(rng_() % uint64_t(islands_));
  f.kind = spec_.kinds[size_t(rng_() % spec_.kinds.size())];
  return f;
}

absl::Status CountRounds(const std::string& rounds_jsonl, int islands, GoodputReport* report) {
  std::ifstream in(rounds_jsonl);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", rounds_jsonl));
  std::string line;
  while (std::getline(in, line)) {
    const auto r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!r.is_object() || r.value("fragment", -1) != 0) continue;
    ++report->rounds;
    if (r.value("progress", true)) report->tokens_committed += r.value("tokens", uint64_t(0));
    if (r.contains("contributors") && int(r["contributors"].size()) < islands) ++report->rounds_short;
    if (const auto it = r.find("ledger"); it != r.end() && it->is_object()) {
      for (const auto& [island, account] : it->items()) {
        report->tokens.Add(TokenAccountFromJson(account));
      }
    }
  }
  return absl::OkStatus();
}

Chaos::Chaos(const ChaosSpec& spec, int islands)
    : spec_(spec), islands_(islands), plan_(spec, islands) {}

absl::Status Chaos::Tick(double now_s, uint64_t committed, ChaosTarget& target) {
  if (committed == 0) return absl::OkStatus();
  if (start_s_ < 0) {
    start_s_ = now_s;
    next_ = plan_.Next();
  }
  for (size_t i = 0; i < recoveries_.size();) {
    const Recovery r = recoveries_[i];
    if (r.at_s > now_s) {
      ++i;
      continue;
    }
    recoveries_.erase(recoveries_.begin() + long(i));
    const bool restart = r.kind == ChaosKind::kKill;
    target.Say(absl::StrFormat("%.1fs: %s %s", now_s, restart ? "restarting" : "SIGCONT to",
                               r.island));
    recovered_[r.island] = now_s;
    if (restart) {
      ATL_RETURN_IF_ERROR(target.Restart(r.island));
    } else {
      target.Signal(r.island, SIGCONT);
    }
  }
  while (!finishing_ && next_ && start_s_ + next_->at_s <= now_s) {
    Fail(*next_, now_s, target);
    next_ = plan_.Next();
  }
  return absl::OkStatus();
}

void Chaos::Fail(const ChaosPlan::Failure& f, double now_s, ChaosTarget& target) {
  const std::string name = absl::StrCat("island", f.island);
  const bool down = std::any_of(recoveries_.begin(), recoveries_.end(),
                                [&](const Recovery& r) { return r.island == name; });
  if (down || !target.Running(name)) {
    target.Say(absl::StrFormat("%.1fs: %s is down already; no failure", now_s, name));
    return;
  }
  const bool kill_it = f.kind == ChaosKind::kKill;
  target.Say(absl::StrFormat("%.1fs: %s to %s, back in %.0f s", now_s,
                             kill_it ? "SIGKILL" : "SIGSTOP", name, spec_.down_s));
  ++report_.failures;
  victims_.insert(name);
  recovered_.erase(name);
  target.Signal(name, kill_it ? SIGKILL : SIGSTOP);
  recoveries_.push_back({now_s + spec_.down_s, name, f.kind});
}

void Chaos::OnCoordinatorLine(const std::string& line, double now_s, ChaosTarget& target) {
  if (line.find("atoll coordinator: stopped after") != std::string::npos) run_over_ = true;
  // "island 'NAME' joined at round ...": an island back from a failure has rejoined.
  for (auto it = recovered_.begin(); it != recovered_.end(); ++it) {
    if (line.find(absl::StrCat("island '", it->first, "' joined")) != std::string::npos) {
      report_.rejoin_s.push_back(now_s - it->second);
      target.Say(absl::StrFormat("%s rejoined %.1f s after it came back", it->first,
                                 report_.rejoin_s.back()));
      recovered_.erase(it);
      return;
    }
  }
}

void Chaos::OnIslandLine(const std::string& island, const std::string& line) {
  // "step N/M | loss ...": past four fifths of the run, no more failures.
  int64_t step = 0, steps = 0;
  const auto at = line.find("step ");
  if (at != std::string::npos &&
      std::sscanf(line.c_str() + at, "step %" SCNd64 "/%" SCNd64 " |", &step, &steps) == 2 &&
      steps > 0 && 5 * step >= 4 * steps) {
    finishing_ = true;
  }
  // "... done at step N after R rounds: ..., global params HASH"
  if (line.find("done at step") != std::string::npos) finishing_ = true;
  if (const auto at = line.find("global params "); at != std::string::npos) {
    final_hashes_[island] = line.substr(at + 14);  // one per fragment
  }
}

namespace {

// The val_loss of the summary.json of island0's last process in a run directory (a restarted
// island writes to island0.N), none: no such file, or no evaluation in it.
std::optional<double> SummaryValLoss(const std::string& run_dir) {
  std::string dir;
  int newest = -1;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(run_dir, ec)) {
    const std::string name = e.path().filename().string();
    int n = 0;
    if (name == "island0" || (absl::StartsWith(name, "island0.") &&
                              absl::SimpleAtoi(name.substr(8), &n) && n > 0)) {
      if (n > newest) newest = n, dir = e.path().string();
    }
  }
  std::ifstream in(dir + "/summary.json");
  const auto s = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!s.is_object() || !s.contains("val_loss") || !s["val_loss"].is_number()) return std::nullopt;
  return s["val_loss"].get<double>();
}

}  // namespace

absl::StatusOr<GoodputReport> Chaos::Report(const std::string& rounds_jsonl,
                                            uint64_t tokens_expected, const std::string& run_dir) {
  GoodputReport r = report_;
  r.tokens_expected = tokens_expected;
  ATL_RETURN_IF_ERROR(CountRounds(rounds_jsonl, islands_, &r));
  r.val_loss = SummaryValLoss(run_dir);
  if (!spec_.reference.empty()) {
    r.reference_val_loss = SummaryValLoss(spec_.reference);
    if (!r.reference_val_loss) {
      return absl::NotFoundError(absl::StrCat("--chaos reference=", spec_.reference,
                                              ": no island0/summary.json with a val_loss there"));
    }
  }
  r.finished = int(final_hashes_.size());
  r.identical = !final_hashes_.empty();
  for (const auto& [name, hash] : final_hashes_) r.identical &= hash == final_hashes_.begin()->second;
  return r;
}

std::string GoodputReport::Text() const {
  std::vector<std::string> rejoins;
  for (double s : rejoin_s) rejoins.push_back(absl::StrFormat("%.1f", s));
  std::vector<std::string> refused;
  for (const auto& [reason, n] : tokens.refused) refused.push_back(absl::StrCat(reason, " ", n));
  std::string loss = "no val_loss";
  if (val_loss) {
    loss = absl::StrFormat("val_loss %.4f", *val_loss);
    if (reference_val_loss) {
      absl::StrAppendFormat(&loss, " (%+.2f%% against the failure-free run's %.4f)",
                            100 * loss_change(), *reference_val_loss);
    }
  }
  return absl::StrFormat(
      "goodput %.1f%% (%d of %d tokens reached the global model), %d failures, %d of %d rounds "
      "short of an island, rejoin after recovery %s s, %d islands finished, their global "
      "parameters %s; tokens trained %d (recomputed after a restart %d), committed on time %d, "
      "committed stale %d, refused %s, lost %d; %s",
      100 * goodput(), tokens_committed, tokens_expected, failures, rounds_short, rounds,
      rejoins.empty() ? "-" : absl::StrJoin(rejoins, " / "), finished,
      identical ? "bit-identical" : "NOT identical", tokens.trained, tokens.recomputed,
      tokens.on_time, tokens.stale, refused.empty() ? "0" : absl::StrJoin(refused, ", "),
      tokens.lost(), loss);
}

std::string GoodputReport::Json() const {
  nlohmann::json j{{"goodput", goodput()},
                        {"tokens_committed", tokens_committed},
                        {"tokens_expected", tokens_expected},
                        {"failures", failures},
                        {"rounds", rounds},
                        {"rounds_short", rounds_short},
                        {"rejoin_s", rejoin_s},
                        {"finished", finished},
                        {"identical", identical},
                        {"token_account", TokenAccountJson(tokens)}};
  if (val_loss) j["val_loss"] = *val_loss;
  if (reference_val_loss) {
    j["reference_val_loss"] = *reference_val_loss;
    j["loss_change"] = loss_change();
  }
  return j.dump();
}

}  // namespace atl
