#include "src/config/config.h"

#include <toml++/toml.h>

#include <cinttypes>
#include <limits>
#include <sstream>
#include <variant>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compression/status_macros.h"
#include "inner/parallel/pipeline.h"

namespace atl {
namespace {

// A key of the schema, bound to the field it sets.
struct Field {
  std::string key;
  std::variant<bool*, int*, int64_t*, uint64_t*, double*, std::string*> target;
  std::string doc;
};

std::vector<Field> Schema(Config& c) {
  return {
      {"model.n_layer", &c.model.n_layer, "transformer blocks"},
      {"model.d_model", &c.model.d_model, "residual stream width"},
      {"model.n_head", &c.model.n_head, "attention heads (divides d_model)"},
      {"model.context", &c.model.context, "tokens per training sequence"},
      {"model.vocab", &c.model.vocab, "vocabulary size (256 for byte-level text)"},
      {"model.dropout", &c.model.dropout, "dropout probability"},
      {"model.init_seed", &c.model.init_seed, "seed of the parameter initialization"},
      {"data.path", &c.data.path, "text file, directory of text files, or glob of .bin shards"},
      {"data.val_path", &c.data.val_path, "separate validation data (same forms as data.path)"},
      {"data.val_fraction", &c.data.val_fraction, "held-out tail when data.val_path is unset"},
      {"data.seed", &c.data.seed, "seed of the training-window order"},
      {"train.steps", &c.train.steps, "optimizer steps"},
      {"train.batch_size", &c.train.batch_size, "sequences per micro-batch"},
      {"train.grad_accum", &c.train.grad_accum, "micro-batches per optimizer step"},
      {"train.eval_every", &c.train.eval_every, "steps between evaluations (0: only at the end)"},
      {"train.eval_batches", &c.train.eval_batches, "fixed validation micro-batches"},
      {"train.seed", &c.train.seed, "seed of runtime randomness (dropout)"},
      {"train.threads", &c.train.threads, "intra-op CPU threads (0: all cores)"},
      {"train.mixed_precision", &c.train.mixed_precision,
       "\"none\" (fp32) or \"bf16\" (bf16 autocast; fp32 weights, gradients and AdamW)"},
      {"train.device", &c.train.device,
       "\"auto\" (the rank's GPU if there is one), \"cpu\", \"cuda\" (cuda:LOCAL_RANK) or \"cuda:N\""},
      {"activation_checkpoint.mode", &c.train.activation_checkpoint,
       "\"none\" or \"full\" (recompute each block's forward in backward)"},
      {"parallelism.data_parallel_shard_degree", &c.parallelism.data_parallel_shard_degree,
       "FSDP ranks of an island (-1: the ranks the other degrees leave)"},
      {"parallelism.data_parallel_replicate_degree",
       &c.parallelism.data_parallel_replicate_degree, "replicated data-parallel groups (HSDP)"},
      {"parallelism.tensor_parallel_degree", &c.parallelism.tensor_parallel_degree,
       "tensor-parallel ranks"},
      {"parallelism.enable_sequence_parallel", &c.train.sequence_parallel,
       "tensor parallelism also splits the blocks' norms, dropouts and residual stream over the "
       "sequence (1/tp of those activations per rank)"},
      {"parallelism.pipeline_parallel_degree", &c.parallelism.pipeline_parallel_degree,
       "pipeline stages"},
      {"parallelism.pipeline_parallel_microbatches", &c.train.pipeline_microbatches,
       "pipeline micro-batches per micro-batch (each of train.batch_size / this sequences)"},
      {"parallelism.pipeline_parallel_schedule", &c.train.pipeline_schedule,
       "\"GPipe\" or \"1F1B\""},
      {"parallelism.collective_timeout_s", &c.parallelism.collective_timeout_s,
       "a collective inside an island fails after this long (a rank gone)"},
      {"train.log_every", &c.run.log_every, "steps between progress lines"},
      {"train.checkpoint_every", &c.run.checkpoint_every, "steps between checkpoints (0: at end)"},
      {"train.checkpoint_keep", &c.run.checkpoint_keep, "newest checkpoints kept"},
      {"train.init_from", &c.run.init_from,
       "start from these parameters instead of model.init_seed's: a safetensors file (see atoll "
       "import), an atoll checkpoint or run directory"},
      {"optim.lr", &c.optim.lr, "peak learning rate"},
      {"optim.min_lr_ratio", &c.optim.min_lr_ratio, "final lr as a fraction of optim.lr"},
      {"optim.warmup_steps", &c.optim.warmup_steps, "linear warmup steps"},
      {"optim.grad_clip", &c.optim.grad_clip, "max global gradient norm (0: off)"},
      {"optim.beta1", &c.optim.adamw.beta1, "AdamW beta1"},
      {"optim.beta2", &c.optim.adamw.beta2, "AdamW beta2"},
      {"optim.eps", &c.optim.adamw.eps, "AdamW epsilon"},
      {"optim.weight_decay", &c.optim.adamw.weight_decay, "AdamW weight decay (matrices only)"},
      {"outer.run_id", &c.outer.run_id, "run name every RPC carries"},
      {"outer.sync_every", &c.outer.sync_every, "H: inner steps per outer round"},
      {"outer.warm_start_steps", &c.outer.phases.warm_start_steps,
       "sync: the first steps are rounds of one step, plain averages (a data-parallel start)"},
      {"outer.early_sync_every", &c.outer.phases.early_sync_every,
       "sync: after the warm start, H for outer.early_sync_steps steps (0: off)"},
      {"outer.early_sync_steps", &c.outer.phases.early_sync_steps,
       "sync: how long outer.early_sync_every holds (a multiple of it)"},
      {"outer.lr", &c.outer.optimizer.lr, "outer learning rate"},
      {"outer.momentum", &c.outer.optimizer.momentum, "outer momentum (0: plain SGD)"},
      {"outer.lr_warmup_rounds", &c.outer.optimizer.warmup_rounds,
       "sync: outer lr ramps up linearly over a fragment's first rounds"},
      {"outer.lr_decay", &c.outer.optimizer.decay,
       "sync: outer lr after warmup: constant or cosine (to outer.min_lr_ratio x outer.lr)"},
      {"outer.min_lr_ratio", &c.outer.optimizer.min_lr_ratio, "sync: cosine's final outer lr / outer.lr"},
      {"outer.nesterov", &c.outer.optimizer.nesterov, "Nesterov momentum"},
      {"outer.islands", &c.outer.islands, "islands of the run (disjoint data streams)"},
      {"outer.min_islands", &c.outer.min_islands, "contributions that commit a late round"},
      {"outer.round_timeout_s", &c.outer.round_timeout_s, "round deadline after its first push"},
      {"outer.rpc_timeout_s", &c.outer.rpc_timeout_s, "deadline of every other RPC"},
      {"outer.heartbeat_s", &c.outer.heartbeat_s, "seconds between an island's heartbeats"},
      {"outer.lease_s", &c.outer.lease_s, "silence after which an island is dead and dropped"},
      {"outer.reconnect_timeout_s", &c.outer.reconnect_timeout_s,
       "how long islands retry joining (exponential backoff with jitter)"},
      {"outer.durable_every", &c.outer.durable_every,
       "K: the coordinator writes its state every K rounds (1: rounds are released once durable)"},
      {"outer.spike_window", &c.outer.spike_window,
       "loss-spike guard: recent losses to compare with (0: only non-finite losses)"},
      {"outer.spike_factor", &c.outer.spike_factor,
       "loss-spike guard: robust standard deviations above the median that make a spike"},
      {"outer.join_warmup_steps", &c.outer.join_warmup_steps,
       "a late joiner ramps its learning rate up over this many steps (fresh AdamW state)"},
      {"outer.codec", &c.outer.codec, "fp32, bf16, int8, fp4_e2m1 or fp4_e3m0 on the wire"},
      {"outer.error_feedback", &c.outer.error_feedback, "carry codec error into the next round"},
      {"outer.global_copy", &c.outer.global_copy,
       "where pseudo-gradients are made: device (beside the parameters), host, or auto"},
      {"outer.stochastic_rounding", &c.outer.stochastic_rounding,
       "round pseudo-gradients stochastically (unbiased) instead of to nearest"},
      {"outer.num_fragments", &c.outer.num_fragments, "P: Streaming DiLoCo fragments"},
      {"outer.fragment_pattern", &c.outer.fragment_pattern, "strided or sequential blocks"},
      {"outer.fragment_sync_delay", &c.outer.fragment_sync_delay, "tau: steps of overlap"},
      {"outer.auto_tune", &c.outer.auto_tune,
       "sync: the coordinator chooses tau from the islands' measured links and step times"},
      {"outer.target_utilization", &c.outer.target_utilization,
       "auto_tune: the compute utilization tau is chosen to reach"},
      {"outer.auto_tune_headroom", &c.outer.auto_tune_headroom,
       "auto_tune: plan as if transfers took this many times as long as measured (jitter)"},
      {"outer.fragment_update_alpha", &c.outer.fragment_update_alpha,
       "alpha of the merge (negative: 0.5 if tau > 0 or auto_tune, else 0)"},
      {"outer.mode", &c.outer.mode, "sync (rounds) or async (updates applied as they arrive)"},
      {"outer.max_staleness", &c.outer.max_staleness, "async: refuse contributions staler than this"},
      {"outer.staleness_scaling", &c.outer.staleness_scaling,
       "async: scale a contribution by 1 / (1 + staleness)"},
      {"outer.dynamic_local_steps", &c.outer.dynamic_local_steps,
       "async: H of each island follows its inner throughput (DyLU)"},
      {"outer.momentum_delay", &c.outer.momentum_delay,
       "async: delayed Nesterov period N (0: outer.islands)"},
      {"outer.aggregation", &c.outer.aggregation,
       "mean, clipped_mean, trimmed_mean or median (robust to faulty islands)"},
      {"outer.clip_multiple", &c.outer.clip_multiple,
       "clipped_mean: norms clipped to this multiple of the round's median norm"},
      {"outer.trim_fraction", &c.outer.trim_fraction,
       "trimmed_mean: share of values dropped at each end, per coordinate"},
      {"outer.max_update_norm", &c.outer.max_update_norm,
       "refuse contributions whose norm exceeds this x the fragment's parameter norm (0: off)"},
      {"outer.max_update_value", &c.outer.max_update_value,
       "refuse contributions holding a value of larger magnitude (0: off)"},
      {"outer.stream_idle_timeout_s", &c.outer.stream_idle_timeout_s,
       "coordinator: cancel a push stream silent for this long"},
      {"outer.max_pending_calls", &c.outer.max_pending_calls,
       "coordinator: calls not tied to a member (joins, queries), at once"},
      {"outer.max_calls_per_island", &c.outer.max_calls_per_island,
       "coordinator: calls running at once for one island"},
      {"outer.service_threads", &c.outer.service_threads,
       "coordinator: threads for a commit's aggregation, outer step, encoding and hashing"},
      {"outer.connections", &c.outer.connections,
       "island: TCP connections of each rank to the service; pushes, updates and state transfers "
       "are striped over them"},
      {"outer.shards", &c.outer.shards,
       "shard servers holding the outer state (atoll sync-server --shard K/N); fragment f on shard "
       "f mod shards, the coordinator keeps membership only"},
      {"compare.methods", &c.compare.methods, "`atoll compare` rows: baseline, diloco, diloco_<codec>, streaming_<codec>, async"},
  };
}

Field* Find(std::vector<Field>& schema, const std::string& key) {
  for (auto& f : schema) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

absl::Status Unknown(const std::string& key, const std::string& where) {
  return absl::InvalidArgumentError(absl::StrCat("unknown config key '", key, "'", where));
}

// Sets a field from a TOML value, refusing wrong types and values that do not fit.
absl::Status SetFromToml(const Field& f, const toml::node& node, const std::string& where) {
  auto wrong = [&](const char* want) {
    std::ostringstream got;
    got << node.type();
    return absl::InvalidArgumentError(
        absl::StrCat("config key '", f.key, "'", where, " must be ", want, ", got ", got.str()));
  };
  return std::visit(
      [&](auto* target) -> absl::Status {
        using T = std::remove_pointer_t<decltype(target)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (!node.is_string()) return wrong("a string");
          *target = *node.value<std::string>();
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!node.is_boolean()) return wrong("true or false");
          *target = *node.value<bool>();
        } else if constexpr (std::is_same_v<T, double>) {
          if (!node.is_number()) return wrong("a number");
          *target = *node.value<double>();
        } else {
          if (!node.is_integer()) return wrong("an integer");
          const int64_t v = *node.value<int64_t>();
          if constexpr (std::is_same_v<T, uint64_t>) {
            if (v < 0) {
              return absl::InvalidArgumentError(
                  absl::StrCat("config key '", f.key, "'", where, " must be >= 0, got ", v));
            }
          } else if (v < int64_t(std::numeric_limits<T>::min()) ||
                     v > int64_t(std::numeric_limits<T>::max())) {
            return absl::OutOfRangeError(
                absl::StrCat("config key '", f.key, "'", where, " is out of range: ", v));
          }
          *target = T(v);
        }
        return absl::OkStatus();
      },
      f.target);
}

absl::Status SetFromString(const Field& f, const std::string& text) {
  auto wrong = [&](const char* want) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", f.key, ": expected ", want, ", got '", text, "'"));
  };
  return std::visit(
      [&](auto* target) -> absl::Status {
        using T = std::remove_pointer_t<decltype(target)>;
        if constexpr (std::is_same_v<T, std::string>) {
          *target = text;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (text != "true" && text != "false") return wrong("true or false");
          *target = text == "true";
        } else if constexpr (std::is_same_v<T, double>) {
          double v;
          if (!absl::SimpleAtod(text, &v)) return wrong("a number");
          *target = v;
        } else {
          T v;
          if (!absl::SimpleAtoi(text, &v)) return wrong("an integer in range");
          *target = v;
        }
        return absl::OkStatus();
      },
      f.target);
}

absl::Status Walk(const toml::table& table, const std::string& prefix, std::vector<Field>& schema,
                  const std::string& where) {
  for (const auto& [k, node] : table) {
    const std::string key = prefix.empty() ? std::string(k.str()) : absl::StrCat(prefix, ".", std::string(k.str()));
    if (const auto* sub = node.as_table()) {
      ATL_RETURN_IF_ERROR(Walk(*sub, key, schema, where));
      continue;
    }
    Field* f = Find(schema, key);
    if (f == nullptr) return Unknown(key, where);
    ATL_RETURN_IF_ERROR(SetFromToml(*f, node, where));
  }
  return absl::OkStatus();
}

absl::Status ValidateRun(const RunConfig& r) {
  if (r.log_every <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("train.log_every must be positive, got ", r.log_every));
  }
  if (r.checkpoint_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.checkpoint_every must be >= 0, got ", r.checkpoint_every));
  }
  if (r.checkpoint_keep < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.checkpoint_keep must be at least 1, got ", r.checkpoint_keep));
  }
  return absl::OkStatus();
}

// What the mesh asks of the model, checked before any rank starts.
absl::Status ValidateMeshForModel(const Config& config) {
  const auto& p = config.parallelism;
  if (p.pipeline_parallel_degree > 1) {
    ATL_RETURN_IF_ERROR(
        inner::parallel::ValidatePipeline(config.model.n_layer, p.pipeline_parallel_degree));
  }
  if (p.tensor_parallel_degree > 1) {
    return inner::ValidateTensorParallel(config.model, p.tensor_parallel_degree,
                                         config.train.sequence_parallel);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<Override>> ParseOverrides(const std::vector<std::string>& args) {
  std::vector<Override> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!absl::StartsWith(a, "--") || a.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "'"));
    }
    const auto eq = a.find('=');
    if (eq != std::string::npos) {
      out.emplace_back(a.substr(2, eq - 2), a.substr(eq + 1));
    } else if (i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--")) {
      out.emplace_back(a.substr(2), args[i + 1]);
      ++i;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("option '", a, "' needs a value (", a, "=VALUE)"));
    }
  }
  return out;
}

namespace {

// The overrides on top of what `table` set, then validation.
absl::StatusOr<Config> Resolve(const toml::table& table, const std::string& where,
                               const std::vector<Override>& overrides) {
  Config config;
  auto schema = Schema(config);
  ATL_RETURN_IF_ERROR(Walk(table, "", schema, where));
  for (const auto& [key, value] : overrides) {
    Field* f = Find(schema, key);
    if (f == nullptr) return Unknown(key, " (command line)");
    ATL_RETURN_IF_ERROR(SetFromString(*f, value));
  }
  ATL_RETURN_IF_ERROR(inner::Validate(config.model));
  ATL_RETURN_IF_ERROR(inner::Validate(config.data));
  ATL_RETURN_IF_ERROR(inner::Validate(config.train));
  ATL_RETURN_IF_ERROR(inner::Validate(config.optim, config.train));
  ATL_RETURN_IF_ERROR(ValidateRun(config.run));
  ATL_RETURN_IF_ERROR(inner::parallel::Validate(config.parallelism));
  ATL_RETURN_IF_ERROR(ValidateMeshForModel(config));
  ATL_RETURN_IF_ERROR(outer::Validate(config.outer));
  return config;
}

absl::Status ParseError(const toml::parse_error& e, const std::string& source) {
  const auto& src = e.source();
  return absl::InvalidArgumentError(absl::StrCat("config ", source, ":", src.begin.line, ":",
                                                 src.begin.column, ": ", std::string(e.description())));
}

}  // namespace

absl::StatusOr<Config> LoadConfig(const std::string& path, const std::vector<Override>& overrides) {
  toml::table table;
  if (!path.empty()) {
    try {
      table = toml::parse_file(path);
    } catch (const toml::parse_error& e) {
      if (absl::StrContains(std::string(e.description()), "File could not be opened")) {
        return absl::NotFoundError(absl::StrCat("cannot open config file ", path));
      }
      return ParseError(e, "file " + path);
    }
  }
  return Resolve(table, path.empty() ? "" : absl::StrCat(" in ", path), overrides);
}

absl::StatusOr<Config> ParseConfig(const std::string& toml_text, const std::string& source,
                                   const std::vector<Override>& overrides) {
  toml::table table;
  try {
    table = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    return ParseError(e, source);
  }
  return Resolve(table, absl::StrCat(" in ", source), overrides);
}

std::string ToToml(const Config& config) {
  Config copy = config;
  toml::table root;
  for (const auto& f : Schema(copy)) {
    const auto dot = f.key.find('.');
    const std::string section = f.key.substr(0, dot), name = f.key.substr(dot + 1);
    if (!root.contains(section)) root.insert(section, toml::table{});
    auto* table = root[section].as_table();
    std::visit(
        [&](auto* target) {
          using T = std::remove_pointer_t<decltype(target)>;
          if constexpr (std::is_same_v<T, uint64_t>) {
            table->insert(name, int64_t(*target));
          } else {
            table->insert(name, *target);
          }
        },
        f.target);
  }
  std::ostringstream out;
  out << root << "\n";
  return out.str();
}

std::vector<std::pair<std::string, std::string>> DescribeKeys() {
  Config c;
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : Schema(c)) out.emplace_back(f.key, f.doc);
  return out;
}

}  // namespace atl
