#include "outer/base/outer_config.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "compression/config_value.h"
#include "compression/status_macros.h"
#include "outer/base/aggregation.h"
#include "outer/base/names.h"

namespace atl::outer {
namespace {

constexpr EnumName<OuterMode> kModes[] = {{OuterMode::kSync, "sync"}, {OuterMode::kAsync, "async"}};
constexpr EnumName<GlobalCopy> kGlobalCopies[] = {
    {GlobalCopy::kAuto, "auto"}, {GlobalCopy::kDevice, "device"}, {GlobalCopy::kHost, "host"}};

}  // namespace

absl::Status ParseConfigValue(const std::string& text, OuterMode* value) {
  return ParseEnumValue(text, kModes, value);
}
std::string ConfigValueText(OuterMode value) { return EnumValueName(value, kModes); }

constexpr EnumName<RunEnd> kRunEnds[] = {{RunEnd::kSteps, "steps"}, {RunEnd::kTokens, "tokens"}};
absl::Status ParseConfigValue(const std::string& text, RunEnd* value) {
  return ParseEnumValue(text, kRunEnds, value);
}
std::string ConfigValueText(RunEnd value) { return EnumValueName(value, kRunEnds); }

absl::Status ParseConfigValue(const std::string& text, GlobalCopy* value) {
  return ParseEnumValue(text, kGlobalCopies, value);
}
std::string ConfigValueText(GlobalCopy value) { return EnumValueName(value, kGlobalCopies); }

namespace {

// Membership, rounds and their deadlines.
absl::Status ValidateRounds(const OuterConfig& c) {
  if (c.sync_every < 1) {
    return absl::InvalidArgumentError(absl::StrCat("outer.sync_every must be >= 1, got ", c.sync_every));
  }
  if (c.islands < 1) {
    return absl::InvalidArgumentError(absl::StrCat("outer.islands must be >= 1, got ", c.islands));
  }
  if (c.min_islands < 1 || c.min_islands > c.islands) {
    return absl::InvalidArgumentError(absl::StrCat("outer.min_islands must be in [1, outer.islands = ",
                                                   c.islands, "], got ", c.min_islands));
  }
  if (!(c.round_timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.round_timeout_s must be positive, got ", c.round_timeout_s));
  }
  if (!(c.rpc_timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.rpc_timeout_s must be positive, got ", c.rpc_timeout_s));
  }
  if (!(c.heartbeat_s > 0) || !(c.lease_s > c.heartbeat_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.lease_s (", c.lease_s, ") must be longer than outer.heartbeat_s (", c.heartbeat_s,
        "), both positive"));
  }
  if (c.spike_window < 0 || !(c.spike_factor > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.spike_window must be >= 0 and outer.spike_factor > 0, got ", c.spike_window, " and ",
        c.spike_factor));
  }
  if (c.checkpoint_rounds < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.checkpoint_rounds must be >= 0, got ", c.checkpoint_rounds));
  }
  if (c.join_warmup_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.join_warmup_steps must be >= 0, got ", c.join_warmup_steps));
  }
  if (c.moment_sync_every < 0 || c.moment_sync_every > 100000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.moment_sync_every must be in [0, 100000], got ", c.moment_sync_every));
  }
  if (c.durable_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.durable_every must be >= 1, got ", c.durable_every));
  }
  if (!(c.reconnect_timeout_s >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.reconnect_timeout_s must be >= 0, got ", c.reconnect_timeout_s));
  }
  return absl::OkStatus();
}

// Streaming DiLoCo: fragments, overlap, auto-tune, the merge.
absl::Status ValidateStreaming(const OuterConfig& c) {
  if (c.num_fragments < 1 || c.num_fragments > c.sync_every) {
    return absl::InvalidArgumentError(absl::StrCat("outer.num_fragments must be in [1, outer.sync_every = ",
                                                   c.sync_every, "], got ", c.num_fragments));
  }
  if (c.fragment_sync_delay < 0 || c.fragment_sync_delay >= c.sync_every) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.fragment_sync_delay must be in [0, outer.sync_every = ", c.sync_every, "), got ",
        c.fragment_sync_delay));
  }
  if (!(c.target_utilization > 0 && c.target_utilization < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.target_utilization must be in (0, 1), got ", c.target_utilization));
  }
  if (!(c.auto_tune_headroom >= 1 && c.auto_tune_headroom <= 100)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.auto_tune_headroom must be in [1, 100], got ", c.auto_tune_headroom));
  }
  if (c.auto_tune && c.async()) {
    return absl::InvalidArgumentError(
        "outer.auto_tune chooses tau for sync rounds; async islands push on their own schedule "
        "(DyLU): turn one of them off");
  }
  if (c.eager_updates && c.fragment_sync_delay == 0 && !c.auto_tune) {
    return absl::InvalidArgumentError(
        "outer.eager_updates = true stands in for rounds in flight: it needs "
        "outer.fragment_sync_delay > 0 (or outer.auto_tune = true); with tau = 0 every round "
        "lands before the next inner step");
  }
  if (c.eager_updates && c.async()) {
    return absl::InvalidArgumentError(
        "outer.eager_updates = true is for sync rounds: async islands apply each version as it "
        "comes (outer.mode = \"async\")");
  }
  if (c.eager_updates && c.global_copy == GlobalCopy::kDevice) {
    return absl::InvalidArgumentError(
        "outer.eager_updates = true makes its stand-ins on the host: use outer.global_copy = "
        "\"host\" or \"auto\"");
  }
  if (c.fragment_update_alpha > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.fragment_update_alpha must be in [0, 1] (or negative for the default), got ",
        c.fragment_update_alpha));
  }
  return absl::OkStatus();
}

// Sparse pseudo-gradients and error feedback.
absl::Status ValidateSparse(const OuterConfig& c) {
  if (!(c.topk_density > 0 && c.topk_density <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.topk_density must be in (0, 1], got ", c.topk_density));
  }
  if (c.topk_chunk < 32 || c.topk_chunk > 4096 || c.topk_chunk % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.topk_chunk must be a multiple of 32 in 32..4096, got ", c.topk_chunk));
  }
  if (!(c.error_feedback_decay >= 0 && c.error_feedback_decay <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.error_feedback_decay must be in [0, 1], got ", c.error_feedback_decay));
  }
  if (!c.sparse()) return absl::OkStatus();
  if (!c.error_feedback) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.topk_density = ", c.topk_density, " drops ", 100 * (1 - c.topk_density),
        "% of every pseudo-gradient: it needs outer.error_feedback = true, which carries what "
        "was not sent into the next round"));
  }
  if (c.aggregation == AggregationRule::kTrimmedMean || c.aggregation == AggregationRule::kMedian) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.aggregation = ", AggregationRuleName(c.aggregation),
        " works per coordinate, where sparse contributions are mostly zeros: it would drop what "
        "a single island sent; with outer.topk_density < 1 use mean or clipped_mean"));
  }
  return absl::OkStatus();
}

// Async mode's own keys.
absl::Status ValidateAsync(const OuterConfig& c) {
  if (c.max_staleness < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.max_staleness must be >= 0 (or -1: the mode's default), got ", c.max_staleness));
  }
  if (c.momentum_delay < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.momentum_delay must be >= 0, got ", c.momentum_delay));
  }
  return absl::OkStatus();
}

// Contributions' scoring and reputation, and the rehearsed hostile roles.
absl::Status ValidateScoring(const OuterConfig& c) {
  if (c.scoring != "off" && c.scoring != "loss_probe") {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.scoring must be \"off\" or \"loss_probe\", got \"", c.scoring, "\""));
  }
  if (c.fault != "none" && c.fault != "sign_flip" && c.fault != "noise" && c.fault != "copy") {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.fault must be \"none\", \"sign_flip\", \"noise\" or \"copy\", got \"", c.fault,
        "\""));
  }
  if (c.fault == "copy" && c.fault_rounds != 0) {
    return absl::InvalidArgumentError(
        "outer.fault_rounds applies to sign_flip and noise; a copier copies for the whole run");
  }
  if (c.probe_batches < 1 || c.probe_batches > 64 || c.exclude_rounds < 0 || c.fault_rounds < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.probe_batches must be in 1..64, outer.exclude_rounds and outer.fault_rounds >= 0, "
        "got ", c.probe_batches, ", ", c.exclude_rounds, " and ", c.fault_rounds));
  }
  if (!(c.leave_one_out_t >= 0 && c.leave_one_out_t < 8)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.leave_one_out_t must be in [0, 8) (0: off; a round counts at most 8 standard "
        "errors, so the evidence never reaches 8), got ", c.leave_one_out_t));
  }
  if (!(c.step_guard >= 0 && c.step_guard <= 10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.step_guard must be in [0, 10] (a fraction of the held-out loss; 0: off), got ",
        c.step_guard));
  }
  if (!(c.reputation_decay >= 0 && c.reputation_decay < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.reputation_decay must be in [0, 1), got ", c.reputation_decay));
  }
  if (!(c.exclude_below >= 0 && c.exclude_below < c.reputation_floor && c.reputation_floor <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.exclude_below must be in [0, outer.reputation_floor) and outer.reputation_floor "
        "at most 1, got ", c.exclude_below, " and ", c.reputation_floor));
  }
  if (c.scoring == "loss_probe" && (c.async() || c.shards > 1)) {
    return absl::InvalidArgumentError(
        "outer.scoring = loss_probe judges sync rounds on one service holding the whole model: "
        "async mode and outer.shards > 1 are not supported with it");
  }
  return absl::OkStatus();
}

// Robust aggregation and the bounds on contributions.
absl::Status ValidateDefences(const OuterConfig& c) {
  if (!(c.clip_multiple > 0) || !std::isfinite(c.clip_multiple)) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.clip_multiple must be positive, got ", c.clip_multiple));
  }
  if (!(c.trim_fraction >= 0 && c.trim_fraction < 0.5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.trim_fraction must be in [0, 0.5), got ", c.trim_fraction));
  }
  for (const auto& [key, value] : {std::pair<const char*, double>{"copy_overlap", c.copy_overlap},
                                   {"copy_cosine", c.copy_cosine}}) {
    if (!(value >= 0 && value <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("outer.", key, " must be in [0, 1] (0: off), got ", value));
    }
  }
  ATL_RETURN_IF_ERROR(ValidateScoring(c));
  AggregationOptions rule;
  rule.rule = c.aggregation;
  rule.clip_multiple = c.clip_multiple;
  rule.trim_fraction = c.trim_fraction;
  ATL_RETURN_IF_ERROR(CheckActs(rule, c.islands));
  if (!(c.max_update_norm >= 0) || !(c.max_update_value >= 0) || std::isinf(c.max_update_norm) ||
      std::isinf(c.max_update_value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.max_update_norm and outer.max_update_value must be finite and >= 0 (0: no bound), "
        "got ", c.max_update_norm, " and ", c.max_update_value));
  }
  return absl::OkStatus();
}

// The service's resources: threads, connections, shards, call limits.
absl::Status ValidateService(const OuterConfig& c) {
  if (c.service_threads < 0 || c.service_threads > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.service_threads must be in 0..256 (0: the cores the service may use), got ",
        c.service_threads));
  }
  if (c.connections < 1 || c.connections > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.connections must be in 1..64, got ", c.connections));
  }
  if (c.shards < 1 || c.shards > 64) {
    return absl::InvalidArgumentError(absl::StrCat("outer.shards must be in 1..64, got ", c.shards));
  }
  if (c.shards > 1 && c.shards > c.num_fragments) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.shards = ", c.shards, " needs at least as many fragments (a shard holds whole "
        "fragments); outer.num_fragments is ", c.num_fragments));
  }
  if (c.shards > 1 && (c.async() || c.auto_tune)) {
    return absl::InvalidArgumentError(
        "outer.shards > 1 serves sync rounds: async mode and outer.auto_tune need the whole "
        "service in one process (outer.shards = 1)");
  }
  if (!(c.stream_idle_timeout_s > 0) || !(c.stream_first_message_s > 0) ||
      c.max_pending_calls < 1 || c.max_calls_per_island < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.stream_idle_timeout_s, outer.stream_first_message_s, outer.max_pending_calls and "
        "outer.max_calls_per_island must be positive, got ", c.stream_idle_timeout_s, ", ",
        c.stream_first_message_s, ", ", c.max_pending_calls, " and ", c.max_calls_per_island));
  }
  return absl::OkStatus();
}

}  // namespace

compression::CodecSpec OuterConfig::wire_codec() const {
  if (!sparse()) return codec;
  const double kept = std::round(topk_density * double(topk_chunk));
  return {codec.codec, uint32_t(topk_chunk), uint32_t(std::clamp(kept, 1.0, double(topk_chunk)))};
}

absl::Status Validate(const OuterConfig& c) {
  ATL_RETURN_IF_ERROR(ValidateName(c.run_id, "outer.run_id"));
  ATL_RETURN_IF_ERROR(ValidateRounds(c));
  ATL_RETURN_IF_ERROR(ValidateStreaming(c));
  ATL_RETURN_IF_ERROR(ValidateSparse(c));
  ATL_RETURN_IF_ERROR(ValidateAsync(c));
  ATL_RETURN_IF_ERROR(ValidateDefences(c));
  ATL_RETURN_IF_ERROR(ValidateService(c));
  ATL_RETURN_IF_ERROR(Validate(c.phases));
  if (c.async() && c.moment_sync_every > 0) {
    return absl::InvalidArgumentError(
        "outer.moment_sync_every averages moments at sync rounds; async mode has none");
  }
  if (c.async() && c.phases.early_sync_every > 0) {
    return absl::InvalidArgumentError(
        "outer.early_sync_every schedules sync rounds; async islands choose their own H "
        "(outer.dynamic_local_steps)");
  }
  return Validate(c.optimizer);
}

}  // namespace atl::outer
