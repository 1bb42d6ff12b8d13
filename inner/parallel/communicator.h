// Collectives inside an island: a thin layer over c10d process groups (Gloo on CPU, NCCL on CUDA,
// chosen by device). Every operation has a timeout and reports failure as a status (a peer that
// died makes its group's operations fail within the timeout, never hang). Nothing here knows of
// the WAN or of gRPC.
//
// Gloo (Debian's libtorch 1.13) has no reduce-scatter and no flat all-gather: ReduceScatter is an
// all-reduce whose caller keeps its shard, and AllGather gathers into views of the flat output.
// Nor has it bf16: bf16 tensors are summed in fp32 and gathered as 16-bit words, on every backend
// (a bf16 reduce-scatter may write an fp32 shard).
#ifndef ATOLL_INNER_PARALLEL_COMMUNICATOR_H_
#define ATOLL_INNER_PARALLEL_COMMUNICATOR_H_

#include <ATen/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace atl::inner::parallel {

// Where this process stands in its island: torchrun's variables.
struct RankInfo {
  int rank = 0;        // RANK
  int world_size = 1;  // WORLD_SIZE
  int local_rank = 0;  // LOCAL_RANK (the device index on its node)
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR
  int master_port = 0;                    // MASTER_PORT
};

// RankInfo from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (a single rank when RANK
// and WORLD_SIZE are unset); errors name the variable.
absl::StatusOr<RankInfo> RankInfoFromEnvironment();

// The rendezvous of an island: a TCP store served by rank 0 at master_addr:master_port (c10d's
// TCPStore, opaque here so that its headers stay in one file).
class Store;
absl::StatusOr<std::shared_ptr<Store>> Rendezvous(const RankInfo& info,
                                                   std::chrono::milliseconds timeout);

// An operation started in the background (a prefetched all-gather).
class Work {
 public:
  virtual ~Work() = default;
  virtual bool IsDone() = 0;
  virtual absl::Status Wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  // A group of `size` ranks named `name` (ranks of other groups use other names); `rank` is this
  // process's place in it. One rank: every operation is local.
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(
      const std::shared_ptr<Store>& store, const std::string& name, int rank, int size,
      bool cuda, std::chrono::milliseconds timeout);

  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual absl::Status AllReduceSum(at::Tensor& t) = 0;
  virtual absl::Status AllReduceMax(at::Tensor& t) = 0;
  // full (flat, size x shard elements) = the shards of every rank, in rank order.
  virtual std::unique_ptr<Work> AllGatherAsync(const at::Tensor& shard, at::Tensor& full) = 0;
  absl::Status AllGather(const at::Tensor& shard, at::Tensor& full) {
    return AllGatherAsync(shard, full)->Wait();
  }
  // shard = the sum over ranks of this rank's part of `full` (full is overwritten).
  virtual absl::Status ReduceScatterSum(at::Tensor& full, at::Tensor& shard) = 0;
  virtual absl::Status Broadcast(at::Tensor& t, int root) = 0;
  // Point to point: the message of tag `tag` from this rank to `dst` (the send completes once
  // `dst` has received it; the Work keeps `t` alive until then).
  virtual std::unique_ptr<Work> SendAsync(const at::Tensor& t, int dst, int tag) = 0;
  absl::Status Send(const at::Tensor& t, int dst, int tag) { return SendAsync(t, dst, tag)->Wait(); }
  virtual absl::Status Recv(at::Tensor& t, int src, int tag) = 0;
  virtual absl::Status Barrier() = 0;

  // Convenience: the bytes of rank `root`, on every rank.
  absl::StatusOr<std::string> BroadcastBytes(const std::string& bytes, int root);
};

}  // namespace atl::inner::parallel

#endif  // ATOLL_INNER_PARALLEL_COMMUNICATOR_H_
