#include "inner/parallel/communicator.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/torch.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "inner/torch_compat.h"

namespace atl::inner::parallel {

class Store {
 public:
  explicit Store(c10::intrusive_ptr<c10d::Store> s) : store(std::move(s)) {}
  c10::intrusive_ptr<c10d::Store> store;
};

namespace {

absl::StatusOr<int> IntVar(const char* name, int fallback, int min, int max) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  int x = 0;
  if (!absl::SimpleAtoi(v, &x) || x < min || x > max) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, "='", v,
                                                   "' must be an integer in [", min, ", ", max,
                                                   "]"));
  }
  return x;
}

absl::Status Failed(const char* what, const std::exception& e) {
  std::string message = e.what();
  // c10 appends a C++ backtrace after the first line: keep the reason.
  if (auto nl = message.find('\n'); nl != std::string::npos) message.resize(nl);
  return absl::UnavailableError(absl::StrCat(what, " failed inside the island: ", message));
}

// Runs a c10d call; any exception (a peer gone, a timeout) becomes UNAVAILABLE.
template <typename F>
absl::Status Guarded(const char* what, F&& f) {
  try {
    f();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return Failed(what, e);
  }
}

class DoneWork : public Work {
 public:
  explicit DoneWork(absl::Status s) : status_(std::move(s)) {}
  bool IsDone() override { return true; }
  absl::Status Wait() override { return status_; }

 private:
  absl::Status status_;
};

class C10dWork : public Work {
 public:
  C10dWork(const char* what, c10::intrusive_ptr<c10d::Work> work, std::vector<at::Tensor> keep,
           std::chrono::milliseconds timeout)
      : what_(what), work_(std::move(work)), keep_(std::move(keep)), timeout_(timeout) {}
  ~C10dWork() override {
    if (!waited_) Wait().IgnoreError();  // the buffers must outlive the operation
  }
  bool IsDone() override { return work_->isCompleted(); }
  absl::Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    status_ = Guarded(what_, [&] { work_->wait(timeout_); });
    return status_;
  }

 private:
  const char* what_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::vector<at::Tensor> keep_;
  std::chrono::milliseconds timeout_;
  bool waited_ = false;
  absl::Status status_;
};

// One rank: nothing to exchange.
class LocalCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status AllReduceSum(at::Tensor&) override { return absl::OkStatus(); }
  absl::Status AllReduceMax(at::Tensor&) override { return absl::OkStatus(); }
  std::unique_ptr<Work> AllGatherAsync(const at::Tensor& shard, at::Tensor& full) override {
    if (full.data_ptr() != shard.data_ptr()) full.copy_(shard);
    return std::make_unique<DoneWork>(absl::OkStatus());
  }
  absl::Status ReduceScatterSum(at::Tensor& full, at::Tensor& shard) override {
    if (full.data_ptr() != shard.data_ptr()) shard.copy_(full);
    return absl::OkStatus();
  }
  absl::Status Broadcast(at::Tensor&, int) override { return absl::OkStatus(); }
  std::unique_ptr<Work> SendAsync(const at::Tensor&, int dst, int) override {
    return std::make_unique<DoneWork>(
        absl::FailedPreconditionError(absl::StrCat("no rank ", dst, " in a group of one")));
  }
  absl::Status Recv(at::Tensor&, int src, int) override {
    return absl::FailedPreconditionError(absl::StrCat("no rank ", src, " in a group of one"));
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
};

class C10dCommunicator : public Communicator {
 public:
  C10dCommunicator(c10::intrusive_ptr<compat::C10dBackend> pg, int rank, int size,
                   std::chrono::milliseconds timeout, bool native_reduce_scatter)
      : pg_(std::move(pg)),
        rank_(rank),
        size_(size),
        timeout_(timeout),
        native_reduce_scatter_(native_reduce_scatter) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllReduceSum(at::Tensor& t) override { return AllReduce(t, c10d::ReduceOp::SUM); }
  absl::Status AllReduceMax(at::Tensor& t) override { return AllReduce(t, c10d::ReduceOp::MAX); }

  std::unique_ptr<Work> AllGatherAsync(const at::Tensor& shard, at::Tensor& full) override {
    if (Bf16(shard) && Bf16(full)) {
      at::Tensor words = full.view(at::kHalf);  // a copy: 16-bit words move on every backend
      return AllGatherAsync(shard.view(at::kHalf), words);
    }
    if (full.numel() != shard.numel() * size_) {
      return std::make_unique<DoneWork>(absl::InvalidArgumentError(absl::StrCat(
          "all-gather of ", shard.numel(), " elements per rank into ", full.numel())));
    }
    try {
      std::vector<std::vector<at::Tensor>> outputs(1);
      for (int r = 0; r < size_; ++r) {
        outputs[0].push_back(full.narrow(0, r * shard.numel(), shard.numel()));
      }
      std::vector<at::Tensor> inputs = {shard};
      auto work = pg_->allgather(outputs, inputs);
      return std::make_unique<C10dWork>("all-gather", std::move(work),
                                        std::vector<at::Tensor>{shard, full},
                                        timeout_);
    } catch (const std::exception& e) {
      return std::make_unique<DoneWork>(Failed("all-gather", e));
    }
  }

  absl::Status ReduceScatterSum(at::Tensor& full, at::Tensor& shard) override {
    const int64_t n = shard.numel();
    if (full.numel() != n * size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("reduce-scatter of ", full.numel(), " elements into shards of ", n));
    }
    if (Bf16(full)) {  // summed in fp32, into a shard of either type
      at::Tensor wide = full.to(at::kFloat);
      if (!Bf16(shard)) return ReduceScatterSum(wide, shard);
      at::Tensor wide_shard = shard.to(at::kFloat);
      ATL_RETURN_IF_ERROR(ReduceScatterSum(wide, wide_shard));
      shard.copy_(wide_shard);
      return absl::OkStatus();
    }
    if (!native_reduce_scatter_) {
      // Gloo: the sum everywhere, each rank keeps its part.
      ATL_RETURN_IF_ERROR(AllReduceSum(full));
      shard.copy_(full.narrow(0, rank_ * n, n));
      return absl::OkStatus();
    }
    return Guarded("reduce-scatter", [&] {
      std::vector<at::Tensor> out = {shard};
      std::vector<std::vector<at::Tensor>> in(1);
      for (int r = 0; r < size_; ++r) in[0].push_back(full.narrow(0, r * n, n));
      pg_->reduce_scatter(out, in)->wait(timeout_);
    });
  }

  absl::Status Broadcast(at::Tensor& t, int root) override {
    return Guarded("broadcast", [&] {
      std::vector<at::Tensor> v = {t};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      pg_->broadcast(v, o)->wait(timeout_);
    });
  }

  std::unique_ptr<Work> SendAsync(const at::Tensor& t, int dst, int tag) override {
    try {
      std::vector<at::Tensor> v = {t};
      auto work = pg_->send(v, dst, tag);
      return std::make_unique<C10dWork>("send", std::move(work), std::move(v), timeout_);
    } catch (const std::exception& e) {
      return std::make_unique<DoneWork>(Failed("send", e));
    }
  }

  absl::Status Recv(at::Tensor& t, int src, int tag) override {
    return Guarded("receive", [&] {
      std::vector<at::Tensor> v = {t};
      pg_->recv(v, src, tag)->wait(timeout_);
    });
  }

  absl::Status Barrier() override {
    // An all-reduce of one element: Gloo's barrier ignores the timeout of a dead peer.
    auto one = at::zeros({1});
    return AllReduceSum(one);
  }

 private:
  static bool Bf16(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16; }

  absl::Status AllReduce(at::Tensor& t, c10d::ReduceOp op) {
    if (Bf16(t)) {  // reduced in fp32
      at::Tensor wide = t.to(at::kFloat);
      ATL_RETURN_IF_ERROR(AllReduce(wide, op));
      t.copy_(wide);
      return absl::OkStatus();
    }
    return Guarded("all-reduce", [&] {
      std::vector<at::Tensor> v = {t};
      c10d::AllreduceOptions o;
      o.reduceOp = op;
      pg_->allreduce(v, o)->wait(timeout_);
    });
  }

  c10::intrusive_ptr<compat::C10dBackend> pg_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  bool native_reduce_scatter_;
};

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || absl::StartsWith(addr, "127.") || addr == "::1";
}

}  // namespace

absl::StatusOr<RankInfo> RankInfoFromEnvironment() {
  RankInfo info;
  ATL_ASSIGN_OR_RETURN(auto world, IntVar("WORLD_SIZE", 1, 1, 1 << 20));
  info.world_size = world;
  ATL_ASSIGN_OR_RETURN(auto rank, IntVar("RANK", 0, 0, info.world_size - 1));
  info.rank = rank;
  ATL_ASSIGN_OR_RETURN(auto local, IntVar("LOCAL_RANK", info.rank, 0, 1 << 20));
  info.local_rank = local;
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') {
    info.master_addr = addr;
  }
  ATL_ASSIGN_OR_RETURN(auto port, IntVar("MASTER_PORT", 0, 0, 65535));
  info.master_port = port;
  if (info.world_size > 1 && info.master_port == 0) {
    return absl::InvalidArgumentError("WORLD_SIZE > 1 needs MASTER_PORT (and MASTER_ADDR)");
  }
  return info;
}

absl::StatusOr<std::shared_ptr<Store>> Rendezvous(const RankInfo& info,
                                                   std::chrono::milliseconds timeout) {
  try {
    c10d::TCPStoreOptions o;
    o.port = uint16_t(info.master_port);
    o.isServer = info.rank == 0;
    o.numWorkers = info.world_size;
    o.waitWorkers = true;
    o.timeout = timeout;
    compat::UseClassicTcpStore(o);
    return std::make_shared<Store>(c10::make_intrusive<c10d::TCPStore>(info.master_addr, o));
  } catch (const std::exception& e) {
    std::string message = e.what();
    if (auto nl = message.find('\n'); nl != std::string::npos) message.resize(nl);
    return absl::UnavailableError(absl::StrCat("rank ", info.rank, " of ", info.world_size,
                                               ": rendezvous at ", info.master_addr, ":",
                                               info.master_port, " failed: ", message));
  }
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Create(
    const std::shared_ptr<Store>& store, const std::string& name, int rank, int size, bool cuda,
    std::chrono::milliseconds timeout) {
  if (size == 1) return std::unique_ptr<Communicator>(new LocalCommunicator());
  if (store == nullptr) return absl::InvalidArgumentError("a group of several ranks needs a store");
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(name, store->store);
  try {
    if (cuda) {
#ifdef USE_C10D_NCCL
      auto o = c10d::ProcessGroupNCCL::Options::create();
      o->timeout = timeout;
      auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, size, o);
      return std::unique_ptr<Communicator>(new C10dCommunicator(pg, rank, size, timeout, true));
#else
      return absl::FailedPreconditionError("this build of libtorch has no NCCL process groups");
#endif
    }
    auto o = c10d::ProcessGroupGloo::Options::create(timeout);
    const char* host = std::getenv("MASTER_ADDR");
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname) {
      o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    } else if (host == nullptr || IsLoopback(host)) {
      o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    } else {
      o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    o->threads = 2;
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, o);
    return std::unique_ptr<Communicator>(new C10dCommunicator(pg, rank, size, timeout, false));
  } catch (const std::exception& e) {
    return Failed(absl::StrCat("creating process group '", name, "'").c_str(), e);
  }
}

absl::StatusOr<std::string> Communicator::BroadcastBytes(const std::string& bytes, int root) {
  auto size = at::tensor({int64_t(bytes.size())}, at::kLong);
  ATL_RETURN_IF_ERROR(Broadcast(size, root));
  auto buf = at::empty({size.item<int64_t>()}, at::kByte);
  if (rank() == root && !bytes.empty()) std::memcpy(buf.data_ptr(), bytes.data(), bytes.size());
  if (buf.numel() > 0) {
    ATL_RETURN_IF_ERROR(Broadcast(buf, root));
  }
  return std::string(static_cast<const char*>(buf.data_ptr()), size_t(buf.numel()));
}

}  // namespace atl::inner::parallel
