// The `atoll` tools' subcommands: the load test, the planner, export, import, generate.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "compression/codec.h"
#include "src/cli/command_line.h"
#include "src/cli/loadtest_command.h"
#include "src/cli/model_commands.h"
#include "src/cli/text_commands.h"
#include "src/cli/plan_command.h"
#include "src/cli/results.h"

namespace atl::cli {

namespace {

struct LoadtestFlags {
  std::string params = "20M";
  int islands = 4, rounds = 3, shards = 1;
};

}  // namespace

Command AddLoadtest(CLI::App& app, CommandLine& cl) {
  auto f = std::make_shared<LoadtestFlags>();
  auto* c = app.add_subcommand(
      "loadtest", "the outer-sync service under load: synthetic islands push random "
      "pseudo-gradients of a model of --params parameters through a real coordinator");
  c->add_option("--params", f->params, "model parameters, e.g. 500M or 1.5B");
  c->add_option("--islands", f->islands, "synthetic islands (M)");
  c->add_option("--rounds", f->rounds, "outer rounds");
  c->add_option("--shards", f->shards, "service shards (1: one coordinator)");
  c->add_option("--config", cl.config_path, "TOML config of the run (its [model] is replaced)");
  c->add_option("--run-dir", cl.run_dir, "directory for the coordinator's log and loadtest.json")
      ->required();
  return {c, [&cl, f](const std::vector<atl::Override>& overrides) {
            atl::LoadtestOptions options;
            if (!ParseCount(f->params, &options.params)) {
              return Fail(absl::InvalidArgumentError(
                  "--params '" + f->params + "' is not a count such as 20000000, 500M or 1.5B"));
            }
            options.islands = f->islands;
            options.rounds = f->rounds;
            options.shards = f->shards;
            options.run_dir = cl.run_dir;
            options.config_path = cl.config_path;
            options.overrides = overrides;  // the load test resolves its own config
            options.binary = SelfPath();
            options.stop = &g_stop;
            auto report = atl::RunLoadtest(options);
            if (!report.ok()) return Fail(report.status());
            return 0;
          }};
}

Command AddPlan(CLI::App& app, CommandLine& cl) {
  auto o = std::make_shared<atl::PlanOptions>();
  auto params = std::make_shared<std::string>();
  auto* c = app.add_subcommand(
      "plan", "before renting GPUs: per method, the compute utilization on a link, the bandwidth "
      "a target utilization needs, bytes per island per round and per hour (a replay of the "
      "schedule, no network)");
  c->add_option("--params", *params, "model parameters, e.g. 1e9 or 1.5B (else --config's model)");
  c->add_option("--config", cl.config_path,
                "TOML config: its model, islands, H, fragments, tau and codec");
  c->add_option("--step-time", o->step_time_s, "seconds of compute per inner step")->required();
  c->add_option("--islands", o->islands, "islands (M)");
  c->add_option("--bandwidth", o->bandwidth, "per island, each way: e.g. 1gbit, 20mbit");
  c->add_option("--latency", o->latency, "one way, e.g. 50ms");
  c->add_option("--connections", o->connections,
                "TCP connections per island (default: the config's outer.connections, or 1)");
  c->add_option("--tcp-window-mib", o->tcp_window_mib, "TCP window per connection, MiB");
  c->add_option("--method", o->method,
                "data_parallel, diloco or streaming (one row with these settings); default: "
                "the ladder of the Streaming DiLoCo paper's Table 4");
  c->add_option("--sync-every", o->sync_every, "H");
  c->add_option("--fragments", o->fragments, "P (streaming)");
  c->add_option("--tau", o->tau, "inner steps of overlap (streaming)");
  c->add_option("--codec", o->codec, atl::compression::CodecsHelp(/*on_the_wire=*/false));
  c->add_option("--topology", o->topology,
                "star (atoll's service, default) or ring (the paper's all-reduce)");
  c->add_option("--target-utilization", o->target, "e.g. 0.95: the bandwidth each method needs");
  c->add_option("--steps", o->steps, "a run of this many steps, ending synced (default: steady)");
  c->add_option("--commit-ns-per-param", o->commit_ns_per_param,
                "the service's commit time per parameter per island (measured: atoll loadtest)");
  c->add_option("--service-threads", o->service_threads,
                "the service's threads for a commit (default: the config's outer.service_threads; "
                "1 when that is 0, the service machine's cores, or without a config)");
  c->add_option("--shards", o->shards,
                "the service's shards: fragment f commits on shard f mod shards (default: the "
                "config's outer.shards, or 1)");
  c->add_option("--commit-parallel-fraction", o->commit_parallel_fraction,
                "the share of a commit that spreads over the threads (measured: 0.76, commit_bench)");
  c->add_option("--service-bandwidth", o->service_bandwidth,
                "the coordinator's own link, each way, shared by all islands (default: unlimited)");
  c->add_option("--svg", o->svg, "write utilization vs bandwidth per method to this SVG file");
  c->add_flag("--json", o->json, "one JSON object per method instead of the table");
  return {c, [&cl, o, params](const std::vector<atl::Override>& overrides) {
            if (!params->empty() && !ParseCount(*params, &o->params)) {
              return Fail(absl::InvalidArgumentError(
                  "--params '" + *params + "' is not a count such as 1e9, 500M or 1.5B"));
            }
            o->config_path = cl.config_path;
            o->overrides = overrides;
            if (auto s = atl::RunPlan(*o); !s.ok()) return Fail(s);
            return 0;
          }};
}

// Export and generate take no --key=value overrides: the model is the source's.
static int NoOverrides(const std::vector<atl::Override>& overrides) {
  if (overrides.empty()) return 0;
  return Fail(absl::InvalidArgumentError("unexpected argument '--" + overrides[0].first + "'"));
}

Command AddExport(CLI::App& app, CommandLine& cl) {
  auto o = std::make_shared<atl::ExportOptions>();
  auto* c = app.add_subcommand(
      "export", "write a model as safetensors or as a Hugging Face directory: the global model "
      "of a run (its coordinator's state, or an `atoll local` run directory) or an island's / "
      "the baseline's checkpoint");
  c->add_option("source", o->source,
                "run directory, coordinator directory or service-state.pb, checkpoint, or "
                "safetensors file, or Hugging Face directory")->required();
  c->add_option("--out", o->out,
                "the safetensors file to write (--format safetensors), or the directory (hf)")
      ->required();
  c->add_option("--format", o->format,
                "safetensors (one file) or hf (a directory transformers' from_pretrained loads: "
                "config.json, model.safetensors or shards with their index, "
                "generation_config.json)");
  c->add_option("--names", o->names,
                "safetensors: hf (Hugging Face's names and layout of the model's family, "
                "default; gpt2 is the same) or atoll (atoll's own)");
  c->add_option("--dtype", o->dtype, "hf: f32 (default) or bf16 (rounded to nearest even)");
  c->add_option("--tokenizer", o->tokenizer,
                "hf: the SentencePiece model to put beside it (default: the run's data.tokenizer)");
  c->add_option("--max-shard-bytes", o->max_shard_bytes,
                "hf: shards of at most this many bytes past it, with model.safetensors.index.json");
  c->add_option("--config", cl.config_path,
                "the run's config, for a service state without config.toml beside it");
  return {c, [&cl, o](const std::vector<atl::Override>& overrides) {
            if (int rc = NoOverrides(overrides)) return rc;
            o->config_path = cl.config_path;
            if (auto s = atl::RunExport(*o); !s.ok()) return Fail(s);
            return 0;
          }};
}

Command AddImport(CLI::App& app, CommandLine& cl) {
  auto o = std::make_shared<atl::ImportOptions>();
  auto* c = app.add_subcommand(
      "import", "start runs from a safetensors file: check every tensor against the model it "
      "describes and write a run config with that [model] and train.init_from set");
  c->add_option("file", o->file,
                "safetensors file (Hugging Face or atoll names) or Hugging Face directory")->required();
  c->add_option("--out", o->out, "the run config to write (TOML, must not exist)")->required();
  c->add_option("--config", cl.config_path,
                "base config: data, training, outer settings (and model.n_head when the file has "
                "no atoll metadata)");
  c->footer(KeysHelp());  // the base config takes --key=value overrides
  return {c, [&cl, o](const std::vector<atl::Override>& overrides) {
            o->config_path = cl.config_path;
            o->overrides = overrides;
            if (auto s = atl::RunImport(*o); !s.ok()) return Fail(s);
            return 0;
          }};
}

Command AddGenerate(CLI::App& app, CommandLine& cl) {
  auto o = std::make_shared<atl::GenerateOptions>();
  auto* c = app.add_subcommand("generate", "sample text from a model, with the run's tokenizer "
                               "(or bytes for a byte-level model)");
  c->add_option("--checkpoint", o->source,
                "run directory, coordinator directory, checkpoint, safetensors file, or Hugging "
                "Face directory")->required();
  c->add_option("--prompt", o->prompt, "text to continue")->required();
  c->add_option("--tokens", o->tokens, "new tokens to sample at most (stops at the tokenizer's eos)");
  c->add_option("--tokenizer", o->tokenizer,
                "SentencePiece model (default: the one the run's config or the directory records)");
  c->add_option("--temperature", o->temperature, "softmax temperature (0: greedy)");
  c->add_option("--top-k", o->top_k, "sample among the k likeliest tokens (0: all)");
  c->add_option("--top-p", o->top_p,
                "sample among the likeliest tokens whose probabilities sum to p (1: all)");
  c->add_flag("!--no-cache", o->kv_cache,
              "run the whole context again for each token instead of the key/value cache");
  c->add_option("--seed", o->seed, "sampling seed");
  c->add_option("--config", cl.config_path,
                "the run's config, for a service state without config.toml beside it");
  return {c, [&cl, o](const std::vector<atl::Override>& overrides) {
            if (int rc = NoOverrides(overrides)) return rc;
            o->config_path = cl.config_path;
            if (auto s = atl::RunGenerate(*o); !s.ok()) return Fail(s);
            return 0;
          }};
}

Command AddTokenizer(CLI::App& app, CommandLine&) {
  auto o = std::make_shared<atl::text::TrainOptions>();
  auto* c = app.add_subcommand("tokenizer", "SentencePiece tokenizers: `atoll tokenizer train`");
  auto* train = c->add_subcommand(
      "train", "train a tokenizer (BPE or unigram) on text files, one sentence per line");
  c->require_subcommand(1);
  train->add_option("--input", o->inputs, "text files (repeat or separate by spaces)")->required();
  train->add_option("--vocab-size", o->vocab_size, "tokens in the vocabulary (256 byte tokens included)");
  train->add_option("--out", o->out, "the model file to write, e.g. tok.model")->required();
  train->add_option("--model-type", o->model_type, "bpe (default) or unigram");
  train->add_option("--threads", o->threads, "trainer threads (0: every core)");
  train->add_option("--max-sentences", o->max_sentences,
                    "lines sampled from large inputs (0: every line)");
  return {c, [o](const std::vector<atl::Override>& overrides) {
            if (int rc = NoOverrides(overrides)) return rc;
            if (auto s = atl::RunTokenizerTrain(*o); !s.ok()) return Fail(s);
            return 0;
          }};
}

Command AddTokenize(CLI::App& app, CommandLine&) {
  auto o = std::make_shared<atl::text::TokenizeOptions>();
  auto* c = app.add_subcommand(
      "tokenize", "turn text into token shards (llm.c's uint16 format, or uint32 past 65,536 "
      "tokens) with a manifest, streaming, on every core");
  c->add_option("--tokenizer", o->tokenizer, "SentencePiece model (tokenizer.model)")->required();
  c->add_option("--input", o->inputs, "text: files, directories or globs")->required();
  c->add_option("--out", o->out, "directory for the shards and manifest.json (new)")->required();
  c->add_option("--threads", o->threads, "encoding threads (0: every core)");
  c->add_option("--shard-tokens", o->shard_tokens, "tokens per shard at most");
  c->add_option("--token-bytes", o->token_width,
                "2 (llm.c uint16) or 4 (uint32); default the narrowest that holds the vocabulary");
  c->add_option("--chunk-bytes", o->chunk_bytes, "text per unit of work, cut at a line end");
  c->add_flag("!--no-document-marks", o->document_marks,
              "do not put the tokenizer's bos before and eos after each input file");
  return {c, [o](const std::vector<atl::Override>& overrides) {
            if (int rc = NoOverrides(overrides)) return rc;
            if (auto s = atl::RunTokenize(*o); !s.ok()) return Fail(s);
            return 0;
          }};
}

Command AddReport(CLI::App& app, CommandLine&) {
  auto o = std::make_shared<atl::ReportOptions>();
  auto* c = app.add_subcommand(
      "report", "gather the runs of several compares (or seeds) into one report: each "
      "LABEL=DIR[,DIR...] a row, its mean validation loss over the runs found under its "
      "directories, and every run on a plot of loss against WAN bytes");
  c->add_option("rows", o->rows, "LABEL=DIR[,DIR...], a row each")->required();
  c->add_option("--out", o->out, "directory for report.md, report.csv and pareto.svg")->required();
  c->add_option("--title", o->title, "title of the report and the plot");
  return {c, [o](const std::vector<atl::Override>& overrides) {
            if (int rc = NoOverrides(overrides)) return rc;
            if (auto r = atl::RunReport(*o); !r.ok()) return Fail(r.status());
            return 0;
          }};
}

}  // namespace atl::cli
