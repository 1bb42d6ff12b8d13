// Files that appear whole or not at all: written to a temporary file next to the target, fsynced,
// renamed over it, and the directory fsynced. A crash leaves the old file (or none), never half a
// new one.
#ifndef ATOLL_SRC_STORE_ATOMIC_FILE_H_
#define ATOLL_SRC_STORE_ATOMIC_FILE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace atl {

// For files written piece by piece (a service state of several GB is never held whole).
class AtomicFile {
 public:
  static absl::StatusOr<std::unique_ptr<AtomicFile>> Create(const std::string& path);
  ~AtomicFile();  // removes the temporary file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  absl::Status Append(const void* data, size_t size);
  // fsync, rename over the target, fsync of the directory.
  absl::Status Commit();

 private:
  AtomicFile(std::string path, std::string tmp, int fd);
  std::string path_, tmp_;
  int fd_;
  bool committed_ = false;
};

// Writes `contents` to `path` atomically.
absl::Status WriteFileAtomic(const std::string& path, const std::string& contents);

}  // namespace atl

#endif  // ATOLL_SRC_STORE_ATOMIC_FILE_H_
