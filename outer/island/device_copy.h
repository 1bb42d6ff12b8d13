// A second copy of the global parameters a rank owns of one fragment, kept where the model trains
// (its GPU), bit for bit equal to IslandSync's own copy, which stays the reference: the service's
// hashes check that one (the hash runs on the host), and a fetch or resync fills it first.
//
// With a device copy, a push's pseudo-gradient (global - local, plus the error-feedback residual)
// is made and encoded on the device, and only the encoded bytes cross to the host; each committed
// update's chunks go to the device encoded, are decoded and applied there, and the model merges
// from the device copy. No copy of the parameters crosses the bus in a round; the host decodes the
// same chunks into its own copy to check the hashes.
//
// Threading: Capture runs on the training thread at a push, before the push's task starts; the
// other calls run on the thread of the fragment's push or fetch, but ResidualSnapshot, which any
// thread may call. The outer step never runs two of
// them at once for one fragment, nor a model's merge of the fragment while its push is in flight.
#ifndef ATOLL_OUTER_ISLAND_DEVICE_COPY_H_
#define ATOLL_OUTER_ISLAND_DEVICE_COPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "compression/codec_spec.h"

namespace atl::outer {

class DeviceCopy {
 public:
  virtual ~DeviceCopy() = default;
  // Elements owned (the fragment's ranges this rank holds, concatenated).
  virtual uint64_t size() const = 0;
  // Replaces the copy with `global` (size() values): a fetch, a resync.
  virtual absl::Status Load(const std::vector<float>& global) = 0;
  // The training thread, at a push: the pseudo-gradient of the model's parameters as they are now
  // (with error feedback plus decay x the residual).
  virtual absl::Status Capture(bool error_feedback, float decay = 1.0f) = 0;
  // Encodes owned elements [at, at + n) of the captured pseudo-gradient into host memory
  // out[EncodedBytes(spec, n)], and copies its first min(n, sample) exact values to exact[] (the
  // encoding error is measured on them). With error feedback, what the encoding dropped is kept
  // as the next residual of those elements.
  virtual absl::Status Encode(const compression::CodecSpec& spec, uint64_t at, uint64_t n,
                              const compression::Rounding& rounding, uint8_t* out, float* exact,
                              uint64_t sample) = 0;
  // The push was accepted: the residual its encoding left becomes the residual.
  virtual void KeepResidual() = 0;
  // A refused contribution, a resync: no residual carries over.
  virtual void ResetResidual() = 0;
  // The residual as of the last accepted push (size() values, zeros when none), for a checkpoint;
  // any thread may call it.
  virtual std::vector<float> ResidualSnapshot() const = 0;
  // A checkpoint's residual (size() values), before the first push of a resumed island.
  virtual absl::Status RestoreResidual(const std::vector<float>& residual) = 0;
  // A committed update's chunk of owned elements [at, at + n): global -= decode(bytes).
  virtual absl::Status Apply(const compression::CodecSpec& spec, uint64_t at, uint64_t n,
                             const std::string& bytes) = 0;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_ISLAND_DEVICE_COPY_H_
