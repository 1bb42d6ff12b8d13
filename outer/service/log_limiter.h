// Repeated log lines under churn, bounded: a member that joins and leaves thousands of times (or a
// peer that takes a new name each time) must not grow the service's log without bound. Each line
// has a key (e.g. "island 'x' joined"); at most `per_key` lines of a key and `total` lines over
// all keys are written per window; the rest are counted, and each key's count is reported in one
// line when its window ends. Memory stays bounded: at most `max_keys` keys are tracked, and a key
// that arrives once the total is spent shares one bucket with the others. Transport-independent,
// clock passed in.
#ifndef ATOLL_OUTER_SERVICE_LOG_LIMITER_H_
#define ATOLL_OUTER_SERVICE_LOG_LIMITER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace atl::outer {

class LogLimiter {
 public:
  struct Options {
    int per_key = 5;
    int total = 100;
    absl::Duration window = absl::Minutes(1);
    size_t max_keys = 1024;
  };
  explicit LogLimiter(Options options) : options_(options) {}
  LogLimiter() : LogLimiter(Options{}) {}

  // Whether a line of `key` may be written at `now`; if not, it is counted.
  bool Allow(const std::string& key, absl::Time now);
  // For each key whose window has ended with lines held back: "<key>: N more such lines in the
  // last <window> (not logged)". Forgets the ended windows.
  std::vector<std::string> Flush(absl::Time now);
  // Lines held back so far, over the limiter's life.
  uint64_t suppressed() const { return suppressed_; }

 private:
  struct Window {
    absl::Time start;
    int written = 0;
    uint64_t held = 0;
  };
  static constexpr const char* kOthers = "(other keys)";

  const Options options_;
  std::map<std::string, Window> keys_;
  absl::Time total_start_ = absl::InfinitePast();
  int total_written_ = 0;
  uint64_t suppressed_ = 0;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_LOG_LIMITER_H_
