// The service's part of moment averaging (outer.moment_sync_every, DES-LOC-like: arXiv 2505.22549):
// at every K-th round of a fragment each island pushes its inner optimizer's moments of it (before
// that round's pseudo-gradient), the service sums them, and once the round has committed their
// average is published: every island loads it in place of its own, and an island joining later
// starts from the newest one instead of zeros.
//
// Moments travel as the moment layout of outer.proto says: two channels of the fragment's N
// elements, channel-major (2N elements), in bf16 both ways. Pushes are checked as pseudo-gradients
// are (run, member, session, chunk order, checksums, sizes), and besides: finite values, a second
// moment never negative, one optimizer per round, each element at most once per island and round,
// a round that is a moment round and not in the future. A refused push changes nothing.
//
// Per fragment the desk keeps the sum being gathered (fp32 values and a count per element) and the
// newest average (with its counts): 2 channels x (4 + 2) bytes each, 24 bytes per parameter,
// whatever the number of islands. Soft state, not
// in the durable state: each island keeps its own moments, and a resumed service publishes again
// at the next moment round.
//
// Thread-safe (its own lock, taken before the core's).
#ifndef ATOLL_OUTER_SERVICE_MOMENT_DESK_H_
#define ATOLL_OUTER_SERVICE_MOMENT_DESK_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "outer/service/rounds.h"
#include "outer/service/service_core.h"

namespace atl::outer {

class MomentDesk {
 public:
  explicit MomentDesk(ServiceCore& core);

  static constexpr compression::CodecSpec kCodec = kMomentCodec;
  static constexpr uint32_t kChannels = kMomentChannels;

  // A push whose first message names its optimizer (PushRequest.moments). Refused at once:
  // NOT_FOUND another run or fragment, PERMISSION_DENIED not a member, FAILED_PRECONDITION moment
  // averaging off, INVALID_ARGUMENT an unknown optimizer. `rounds` renews the island's lease as
  // its data arrives.
  absl::StatusOr<std::unique_ptr<PushStream>> OpenPush(const pb::PushRequest& first,
                                                       Rounds* rounds);
  // The push received whole: checked, then added to its round's sum. FAILED_PRECONDITION a round
  // that is not a moment round, is in the future or was averaged already, or another optimizer's;
  // ALREADY_EXISTS elements the island gave for the round before; INVALID_ARGUMENT values.
  absl::StatusOr<pb::PushResponse> FinishPush(std::unique_ptr<PushStream> stream);
  // Streams the average of request.moments_round() (0: the newest) within [offset, offset + n) of
  // the layout's 2N elements, in bf16. The first fetch of a committed round's moments publishes
  // them. NOT_FOUND none, or none covering the range; FAILED_PRECONDITION another round's or
  // optimizer's, or a round not committed yet.
  absl::Status FetchMoments(const pb::FetchStateRequest& request,
                            const std::function<bool(pb::StateChunk&&)>& write);

  // The newest average's round of a fragment (-1: none), for tests and the status.
  int64_t published_round(uint32_t fragment) const;

 private:
  struct Gathered {
    uint64_t round = 0;
    std::string optimizer;
    std::vector<float> values;     // sums, then (published) averages
    std::vector<uint16_t> counts;  // islands that gave each element
    // Of the open round: the element ranges [begin, end) each island gave.
    std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> given;
  };
  struct Fragment {
    std::unique_ptr<Gathered> open;
    std::shared_ptr<const Gathered> published;
  };
  // The open sum becomes the published average (when it holds anything).
  void PublishLocked(Fragment& m);
  absl::Status CheckRoundLocked(const Fragment& m, uint32_t fragment, uint64_t round,
                                uint64_t open_round) const;
  // The decoded ranges of a push, each checked (finite, channel 1 not negative).
  absl::StatusOr<std::vector<std::pair<uint64_t, std::vector<float>>>> Decode(
      const EncodedPayload& payload, uint64_t n, const PayloadId& id) const;

  ServiceCore& core_;
  mutable std::mutex mu_;
  std::vector<Fragment> fragments_;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_MOMENT_DESK_H_
