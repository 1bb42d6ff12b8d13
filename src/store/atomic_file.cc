#include "src/store/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"

namespace atl {

absl::StatusOr<std::unique_ptr<AtomicFile>> AtomicFile::Create(const std::string& path) {
  const std::string tmp = absl::StrCat(path, ".tmp-", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("create ", tmp, ": ", strerror(errno)));
  return std::unique_ptr<AtomicFile>(new AtomicFile(path, tmp, fd));
}

AtomicFile::AtomicFile(std::string path, std::string tmp, int fd)
    : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) close(fd_);
  if (!committed_) unlink(tmp_.c_str());
}

absl::Status AtomicFile::Append(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InternalError(absl::StrCat("write ", tmp_, ": ", strerror(errno)));
    p += n;
    size -= size_t(n);
  }
  return absl::OkStatus();
}

absl::Status AtomicFile::Commit() {
  if (fsync(fd_) != 0) return absl::InternalError(absl::StrCat("fsync ", tmp_, ": ", strerror(errno)));
  close(fd_);
  fd_ = -1;
  if (rename(tmp_.c_str(), path_.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename ", tmp_, ": ", strerror(errno)));
  }
  committed_ = true;
  const std::filesystem::path target(path_);
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& contents) {
  ATL_ASSIGN_OR_RETURN(auto file, AtomicFile::Create(path));
  ATL_RETURN_IF_ERROR(file->Append(contents.data(), contents.size()));
  return file->Commit();
}

}  // namespace atl
