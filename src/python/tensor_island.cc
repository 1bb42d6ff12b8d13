#include "src/python/tensor_island.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "compression/config_value.h"
#include "compression/status_macros.h"
#include "inner/model_info.h"
#include "outer/base/names.h"
#include "outer/island/island_runtime.h"
#include "src/net/grpc_transport.h"
#include "src/store/model_hashes.h"

namespace atl::python {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The module's parameters as the outer step sees them: each fragment's parameters flat, in the
// run's order (atoll's canonical order for atoll's own model, row-major for any other), through
// their host mirrors where the module's are on a GPU. Counts the tokens of every step, which a
// user's loop may vary.
class ModuleModel : public outer::IslandModel {
 public:
  ModuleModel(std::vector<HostParam> params, MirrorCopies mirrors, inner::ParallelPlan plan,
              std::vector<std::vector<size_t>> fragments)
      : params_(std::move(params)),
        mirrors_(std::move(mirrors)),
        plan_(std::move(plan)),
        fragments_(std::move(fragments)) {}

  int64_t step() const override { return step_; }
  std::vector<float> Snapshot(uint32_t f) override {
    if (mirrors_.to_host) Note(mirrors_.to_host(fragments_[f]));
    return FlattenHost(plan_, params_, fragments_[f]);
  }
  void Merge(uint32_t f, const std::vector<float>& global, double alpha) override {
    LoadHost(plan_, global, params_, fragments_[f], alpha);
    if (mirrors_.from_host) Note(mirrors_.from_host(fragments_[f]));
  }
  // The first failed mirror copy since the last call (the outer step cannot be told).
  absl::Status TakeMirrorError() { return std::exchange(mirror_error_, absl::OkStatus()); }
  void JumpToStep(int64_t step) override {
    step_ = step;
    counted_[step_] = tokens_;  // the steps skipped trained nothing here
  }
  void FollowRunProgress(int64_t position) override { progress_ = position; }
  std::optional<uint64_t> TokensBetween(int64_t from, int64_t to) const override {
    return TokensAt(to) - TokensAt(from);
  }

  void Stepped(uint64_t tokens) {
    ++step_;
    tokens_ += tokens;
    counted_[step_] = tokens_;
    // A push counts from the fragment's last push (at most a few rounds back): older steps go.
    while (counted_.size() > kKeptSteps) counted_.erase(counted_.begin());
  }
  void Resume(int64_t step, uint64_t tokens) {
    step_ = step;
    tokens_ = tokens;
    counted_.clear();
    counted_[step_] = tokens_;
  }
  uint64_t tokens() const { return tokens_; }
  int64_t progress() const { return progress_; }

 private:
  static constexpr size_t kKeptSteps = 1 << 16;
  // The tokens trained through `step` (the newest count at or before it).
  uint64_t TokensAt(int64_t step) const {
    auto it = counted_.upper_bound(step);
    return it == counted_.begin() ? 0 : std::prev(it)->second;
  }

  void Note(absl::Status s) {
    if (mirror_error_.ok()) mirror_error_ = std::move(s);
  }

  const std::vector<HostParam> params_;
  const MirrorCopies mirrors_;
  absl::Status mirror_error_;
  const inner::ParallelPlan plan_;
  const std::vector<std::vector<size_t>> fragments_;
  int64_t step_ = 0;
  uint64_t tokens_ = 0;
  int64_t progress_ = 0;
  std::map<int64_t, uint64_t> counted_{{0, 0}};
};

// The run's fragments (JoinResponse.fragments, by parameter name) as indices into the module's
// parameters: every parameter of the run must be the module's, of the same size, and the module
// must hold no parameter the run does not sync.
absl::StatusOr<std::vector<std::vector<size_t>>> MapFragments(const pb::JoinResponse& joined,
                                                              const std::vector<HostParam>& params) {
  std::map<std::string, size_t> index;
  std::vector<std::string> names;
  for (size_t i = 0; i < params.size(); ++i) {
    index[params[i].name] = i;
    names.push_back(params[i].name);
  }
  std::vector<std::vector<size_t>> fragments;
  std::vector<bool> synced(params.size(), false);
  for (const auto& fragment : joined.fragments()) {
    std::vector<size_t> mine;
    uint64_t elements = 0;
    for (const auto& name : fragment.parameters()) {
      auto it = index.find(name);
      if (it == index.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the run's parameter '", outer::Printable(name, 256), "' (fragment ",
            fragment.fragment(), ") is not one of this module's ", params.size(), " parameters",
            DidYouMean(name, names, '\'')));
      }
      mine.push_back(it->second);
      synced[it->second] = true;
      elements += params[it->second].numel();
    }
    if (elements != fragment.num_elements()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "fragment %d of the run holds %d elements, this module's parameters of it %d: the module "
          "is not the run's model",
          fragment.fragment(), fragment.num_elements(), elements));
    }
    fragments.push_back(std::move(mine));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!synced[i]) {
      return absl::FailedPreconditionError(
          absl::StrCat("this module's parameter '", params[i].name,
                       "' is not in the run's model: every parameter is synced (freeze none, or "
                       "leave it out of the parameters given to the island)"));
    }
  }
  return fragments;
}

}  // namespace

struct TensorIsland::Impl {
  mutable std::mutex mu;  // every public method's turn
  // RequestStop's flag, and whether a Step waits in the outer step (where it acts at once); read
  // by the waits on any thread.
  std::atomic<bool> stop_requested{false};
  std::atomic<bool> stepping{false};
  TensorIslandOptions options;
  std::unique_ptr<outer::Transport> transport;
  std::unique_ptr<outer::IslandRanks> ranks = outer::SingleRank();
  std::unique_ptr<ModuleModel> model;
  std::unique_ptr<outer::IslandRuntime> runtime;  // after the model it drives
  std::vector<LandedRoundRecord> landed;
  Clock::time_point start = Clock::now();
  Clock::time_point last_return = Clock::now();  // of Step: the user's compute runs from there
  double compute_s = 0;
  bool interrupted = false;  // a wait for a round was interrupted (in Step or Close)

  const pb::JoinResponse& joined() const { return runtime->joined(); }
  outer::OuterStepHook& hook() const { return runtime->hook(); }
  void Say(const std::string& line) const {
    if (options.out == nullptr) return;
    std::fprintf(options.out, "[%s] %s\n", options.name.c_str(), line.c_str());
    std::fflush(options.out);
  }
  absl::Status JoinRun(const std::vector<HostParam>& params);
  absl::Status Build(std::vector<HostParam> params, MirrorCopies mirrors);
  absl::Status Finish(bool stopped);
  pb::IslandTelemetry Telemetry(std::optional<double> loss) const;
};

absl::Status TensorIsland::Impl::JoinRun(const std::vector<HostParam>& params) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const HostParam& p : params) shapes.emplace_back(p.name, p.shape);
  outer::RuntimeOptions ro;
  ro.outer = options.config.outer;
  ro.name = options.name;
  ro.model_hash = options.atoll_model ? ModelConfigHash(options.config.model) : LayoutHash(shapes);
  for (const HostParam& p : params) ro.parameters.emplace_back(p.name, p.numel());
  ro.credential_file = options.credential_file;
  ro.seed = options.config.train.seed;
  ro.say = [this](const std::string& line) { Say(line); };
  // The user's interruption (Ctrl-C), then a stop asked while a step waits (SIGTERM).
  ro.interrupted = [this]() -> absl::Status {
    if (options.interrupted) ATL_RETURN_IF_ERROR(options.interrupted());
    if (stepping && stop_requested) return absl::AbortedError("asked to stop while waiting");
    return absl::OkStatus();
  };
  ATL_ASSIGN_OR_RETURN(runtime, outer::IslandRuntime::Join(*transport, *ranks, std::move(ro)));
  return absl::OkStatus();
}

absl::Status TensorIsland::Impl::Build(std::vector<HostParam> params, MirrorCopies mirrors) {
  ATL_ASSIGN_OR_RETURN(auto fragments, MapFragments(joined(), params));
  std::vector<outer::FragmentShare> shares;
  for (const auto& f : joined().fragments()) shares.push_back({f.num_elements(), {}, true});
  inner::ParallelPlan plan;  // a module's parameters flatten row-major
  plan.blocks.clear();
  if (options.atoll_model) plan = inner::PlanOf(options.config.model);
  model = std::make_unique<ModuleModel>(std::move(params), std::move(mirrors), std::move(plan),
                                        std::move(fragments));
  // A resumed island stands at its checkpoint's step before the outer step is made: its pushes
  // count from there.
  outer::StartOptions start;  // the model counts its tokens step by step
  if (options.resume) {
    model->Resume(options.resume->step, options.resume->tokens);
    start.resumed = true;
    start.residuals = options.resume->residuals;
  }
  ATL_RETURN_IF_ERROR(runtime->Start(*model, std::move(shares), std::move(start)));
  ATL_RETURN_IF_ERROR(model->TakeMirrorError());
  hook().set_observer([this](const outer::LandedRound& r) {
    landed.push_back({r.fragment, r.outcome.round, r.outcome.version, r.pushed_at, r.step,
                      r.global_hash, r.outcome.contributors, r.outcome.resynced});
    if (landed.size() > 100000) landed.erase(landed.begin(), landed.begin() + 50000);
  });
  hook().on_message = [this](const std::string& line) { Say(line); };
  uint64_t elements = 0;
  for (const auto& f : joined().fragments()) elements += f.num_elements();
  Say(absl::StrFormat("joined %s run '%s' at %s %d as %s: data stream %d of %d, %s, %.2fM "
                      "parameters%s",
                      runtime->async() ? "async" : "sync", options.config.outer.run_id,
                      runtime->async() ? "version" : "round", hook().round(),
                      runtime->session().island_id(), joined().data_stream(),
                      joined().schedule().num_data_streams(), hook().Describe(), elements / 1e6,
                      options.resume ? absl::StrFormat(", resumed at step %d", options.resume->step)
                                     : ""));
  return absl::OkStatus();
}

pb::IslandTelemetry TensorIsland::Impl::Telemetry(std::optional<double> loss) const {
  const double wall = std::max(1e-9, Since(start));
  outer::TrainingFigures f;
  f.loss = loss.value_or(0.0);
  f.tokens = model->tokens();
  f.tokens_trained = model->tokens() - (options.resume ? options.resume->tokens : 0);
  f.tokens_per_s = double(f.tokens_trained) / wall;
  f.utilization = compute_s / wall;
  return outer::TelemetryOf(f, hook().stats());
}

absl::Status TensorIsland::Impl::Finish(bool stopped) {
  if (interrupted) {
    runtime->Abandon();
    Say(absl::StrFormat("left at step %d without waiting (interrupted): the rounds in flight "
                        "were not merged", model->step()));
    return absl::OkStatus();
  }
  if (runtime->finished()) return absl::OkStatus();
  absl::Status s = runtime->Finish(stopped);
  interrupted = absl::IsCancelled(s);
  if (s.ok()) s = model->TakeMirrorError();
  const outer::OuterStepHook& h = hook();
  Say(absl::StrFormat("%s at step %d after %d rounds: sent %.1f MiB, received %.1f MiB, global "
                      "params %s",
                      stopped ? "left" : "done", model->step(), h.stats().rounds,
                      h.stats().bytes_sent / 1048576.0, h.stats().bytes_received / 1048576.0,
                      absl::StrJoin(h.fragment_hashes(), " ", [](std::string* out, uint64_t h) {
                        absl::StrAppend(out, absl::StrFormat("%016x", h));
                      })));
  return s;
}

TensorIsland::TensorIsland(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TensorIsland::~TensorIsland() {
  if (!impl_->runtime) return;
  if (impl_->interrupted) {
    impl_->runtime->Abandon();  // the rounds in flight would be waited for
  } else {
    impl_->runtime->Leave();
  }
}

absl::StatusOr<std::unique_ptr<TensorIsland>> TensorIsland::Join(TensorIslandOptions options,
                                                                 std::vector<HostParam> params,
                                                                 MirrorCopies mirrors) {
  ATL_RETURN_IF_ERROR(outer::ValidateName(options.name, "island name"));
  ATL_RETURN_IF_ERROR(CheckHostParams(params));
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("the coordinator's address (HOST:PORT) is required");
  }
  if (options.config.outer.fault == "copy") {
    return absl::InvalidArgumentError(
        "outer.fault = \"copy\" is rehearsed by atoll's own island (it trains another island's "
        "data stream); a Python loop brings its own data");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  ATL_ASSIGN_OR_RETURN(impl->transport,
                       ConnectIsland(impl->options.coordinator, impl->options.token,
                                     impl->options.tls, impl->options.config.outer));
  ATL_RETURN_IF_ERROR(impl->JoinRun(params));
  if (auto s = impl->Build(std::move(params), std::move(mirrors)); !s.ok()) {
    impl->runtime->Leave();
    return s;
  }
  return std::unique_ptr<TensorIsland>(new TensorIsland(std::move(impl)));
}

absl::StatusOr<bool> TensorIsland::Step(uint64_t tokens, std::optional<double> loss, bool stop) {
  Impl& i = *impl_;
  auto turn = Turn();
  if (i.interrupted) {
    return absl::FailedPreconditionError(
        "the island was interrupted while it waited for a round: close() it (it leaves the run "
        "without waiting for the rounds in flight)");
  }
  if (i.runtime->finished()) return false;
  i.compute_s += Since(i.last_return);
  if (stop) {
    ATL_RETURN_IF_ERROR(i.Finish(/*stopped=*/true));
    return false;
  }
  if (loss && !std::isfinite(*loss)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", i.model->step() + 1, ": the loss is not finite (", *loss,
        "); nothing was synced: reload the module's parameters or stop"));
  }
  i.model->Stepped(tokens);
  i.runtime->session().set_step(i.model->step());
  i.runtime->session().set_telemetry(i.Telemetry(loss));
  const double steps_per_s = double(i.model->step()) / std::max(1e-9, i.compute_s);
  i.stepping = true;
  const absl::Status stepped = i.hook().AfterStep(steps_per_s);
  i.stepping = false;
  if (!stepped.ok() && i.stop_requested) {
    // Asked to stop (SIGTERM) while it waited for a round: what it trained is pushed; it leaves.
    i.runtime->Abandon();
    i.Say(absl::StrFormat("left at step %d (asked to stop) without waiting for the round in flight",
                          i.model->step()));
    return false;
  }
  i.interrupted = absl::IsCancelled(stepped);
  ATL_RETURN_IF_ERROR(stepped);
  ATL_RETURN_IF_ERROR(i.model->TakeMirrorError());
  if (i.hook().done()) {
    ATL_RETURN_IF_ERROR(i.Finish(/*stopped=*/false));
    i.last_return = Clock::now();
    return false;
  }
  i.last_return = Clock::now();
  return true;
}

void TensorIsland::RequestStop() { impl_->stop_requested = true; }

absl::Status TensorIsland::Close() {
  auto turn = Turn();
  return impl_->Finish(/*stopped=*/!impl_->hook().done());
}

IslandState TensorIsland::State() const {
  auto turn = Turn();
  IslandState s;
  s.step = impl_->model->step();
  s.tokens = impl_->model->tokens();
  s.rounds = impl_->hook().Rounds();
  s.global_hashes = impl_->hook().fragment_hashes();
  s.residuals = impl_->hook().Residuals();
  return s;
}

// The accessors, each in its turn.
std::unique_lock<std::mutex> TensorIsland::Turn() const { return std::unique_lock(impl_->mu); }

int64_t TensorIsland::step() const { auto turn = Turn(); return impl_->model->step(); }
uint64_t TensorIsland::tokens() const { auto turn = Turn(); return impl_->model->tokens(); }
bool TensorIsland::done() const {
  auto turn = Turn();
  return impl_->runtime->finished() || impl_->hook().done();
}
bool TensorIsland::async() const { return impl_->joined().schedule().async(); }  // set at the join
int64_t TensorIsland::max_steps() const { auto turn = Turn(); return impl_->hook().max_steps(); }
int64_t TensorIsland::run_progress() const {
  auto turn = Turn();
  return async() ? impl_->model->progress() : impl_->model->step();
}
uint32_t TensorIsland::num_fragments() const { return uint32_t(impl_->joined().fragments_size()); }
std::vector<std::vector<std::string>> TensorIsland::fragment_parameters() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& f : impl_->joined().fragments()) {
    out.emplace_back(f.parameters().begin(), f.parameters().end());
  }
  return out;
}
std::vector<uint64_t> TensorIsland::fragment_hashes() const {
  auto turn = Turn();
  return impl_->hook().fragment_hashes();
}
std::vector<uint64_t> TensorIsland::rounds() const { auto turn = Turn(); return impl_->hook().Rounds(); }
std::string TensorIsland::island_id() const { return impl_->runtime->session().island_id(); }
std::string TensorIsland::Describe() const { auto turn = Turn(); return impl_->hook().Describe(); }
outer::OuterStepStats TensorIsland::stats() const { auto turn = Turn(); return impl_->hook().stats(); }
std::vector<LandedRoundRecord> TensorIsland::landed() const { auto turn = Turn(); return impl_->landed; }

}  // namespace atl::python
