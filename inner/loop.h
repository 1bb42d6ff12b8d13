// The one training loop of atoll: `atoll train`, every island (each of its ranks) and the load
// test's synthetic islands run it. It queues steps (which never wait for the device) and after
// each step t calls its parts, each in the order given, at these points:
//   BeforeStep / QueueStep / Queued(t)   the step (an island throttles and counts its time)
//   stats       when a part's StatsDue(t), or at the loop's last step: the steps' stats since the
//               last report, in one copy from the device, to every part's OnStats (reports, the
//               loss-spike guard, an island's monitor)
//   OuterStep(t)  an island's outer step (push, land, rejoin: it may move the step counter);
//               says whether this was the run's last step
//   AfterStep(t, last)  what a part does on its own cadence: an evaluation, a checkpoint
//   Stop(t)     leave after this step (every rank of an island decides alike)
// After the loop the stats of the steps not reported yet go to OnStats. Each part owns its
// cadence and its state (inner/loop_parts.h has the ones every loop shares); nothing here knows
// about the network: an island plugs its outer sync in as a part. Torch-free.
#ifndef ATOLL_INNER_LOOP_H_
#define ATOLL_INNER_LOOP_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace atl::inner {

struct StepStats {
  int64_t step = 0;      // steps completed, counting this one
  double loss = 0;       // mean training loss of the step's micro-batches (nats)
  double lr = 0;
  double grad_norm = 0;  // before clipping
  int64_t tokens = 0;    // tokens this trainer has consumed in total
  double compute_s = 0;  // wall seconds of the step
};

struct EvalStats {
  double loss = 0;        // mean validation loss (nats per token)
  double bits = 0;        // loss in bits per token
  bool per_byte = false;  // tokens are bytes (text data): `bits` is bits per byte
  // Bits per byte of the evaluated text, whatever the tokenizer (bytes: `bits`; token shards: from
  // their tokenizer's token lengths); < 0 when unknown.
  double bits_per_byte = -1;
};

// What the loop steps: a Trainer, or anything that stands for one.
class StepSource {
 public:
  virtual ~StepSource() = default;
  virtual int64_t step() const = 0;
  virtual absl::Status QueueStep() = 0;
  // The stats of the steps queued since the last call, in order.
  virtual absl::StatusOr<std::vector<StepStats>> TakeStats() = 0;
};

// A piece of the loop. Every call returning an error stops the loop with it.
class LoopPart {
 public:
  virtual ~LoopPart() = default;
  virtual void BeforeStep() {}
  virtual absl::Status Queued(int64_t /*step*/) { return absl::OkStatus(); }
  // Whether the steps' stats must come over after `step` (one host sync) for this part. Every
  // rank of an island must answer alike.
  virtual bool StatsDue(int64_t /*step*/) const { return false; }
  virtual absl::Status OnStats(const std::vector<StepStats>& /*steps*/) {
    return absl::OkStatus();
  }
  virtual absl::StatusOr<bool> OuterStep(int64_t /*step*/) { return false; }
  // `last`: the loop ends after this step.
  virtual absl::Status AfterStep(int64_t /*step*/, bool /*last*/) { return absl::OkStatus(); }
  virtual absl::StatusOr<bool> Stop(int64_t /*step*/) { return false; }
};

// Steps `steps` until it has completed `until_step` steps, an outer step says the run is done,
// or a part stops it.
absl::Status RunLoop(StepSource& steps, int64_t until_step, const std::vector<LoopPart*>& parts);

}  // namespace atl::inner

#endif  // ATOLL_INNER_LOOP_H_
