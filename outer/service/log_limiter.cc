#include "outer/service/log_limiter.h"

#include "absl/strings/str_cat.h"

namespace atl::outer {

bool LogLimiter::Allow(const std::string& key, absl::Time now) {
  if (now - total_start_ >= options_.window) {
    total_start_ = now;
    total_written_ = 0;
  }
  auto it = keys_.find(key);
  if (it == keys_.end()) {
    // A new key is tracked only while it can be written: keys, and so the lines Flush reports,
    // stay within the total per window (a peer with a new name each time counts as the others).
    const bool track = keys_.size() < options_.max_keys && total_written_ < options_.total;
    it = keys_.try_emplace(track ? key : kOthers, Window{now}).first;
  }
  Window& w = it->second;
  if (now - w.start >= options_.window && w.held == 0) w = Window{now};
  if (w.written >= options_.per_key || total_written_ >= options_.total) {
    ++w.held;
    ++suppressed_;
    return false;
  }
  ++w.written;
  ++total_written_;
  return true;
}

std::vector<std::string> LogLimiter::Flush(absl::Time now) {
  std::vector<std::string> lines;
  for (auto it = keys_.begin(); it != keys_.end();) {
    const Window& w = it->second;
    if (now - w.start < options_.window) {
      ++it;
      continue;
    }
    if (w.held > 0) {
      lines.push_back(absl::StrCat(it->first, ": ", w.held, " more such lines in the last ",
                                   absl::FormatDuration(now - w.start), " (not logged)"));
    }
    it = keys_.erase(it);
  }
  return lines;
}

}  // namespace atl::outer
