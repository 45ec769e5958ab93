#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <utility>

namespace refit {
namespace {

// The directory a new file for `path` goes into.
std::string directory_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// `<path>.tmp.<pid>.<n>`: no other live writer uses it (the count is this
// process's own), so one that exists is a dead process's (it had this pid).
std::string temporary_name(const std::string& path) {
  static std::atomic<unsigned> count{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(count++);
}

// Links the unnamed file open as `fd` as `name`: 0, or the errno. Through
// /proc/self/fd/N (AT_SYMLINK_FOLLOW), which any process may do; without
// /proc, AT_EMPTY_PATH, which needs CAP_DAC_READ_SEARCH.
int link_unnamed(int fd, const std::string& name) {
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) == 0) return 0;
  const int err = errno;
  if (err == ENOENT && ::linkat(fd, "", AT_FDCWD, name.c_str(), AT_EMPTY_PATH) == 0) return 0;
  return err;
}

}  // namespace

StagedFile::StagedFile(std::string path, int fd, bool unnamed, std::string temporary)
    : path_(std::move(path)), fd_(fd), unnamed_(unnamed), temporary_(std::move(temporary)) {}

StagedFile::StagedFile(StagedFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), unnamed_(other.unnamed_),
      temporary_(std::exchange(other.temporary_, std::string())) {}

StagedFile& StagedFile::operator=(StagedFile&& other) noexcept {
  if (this != &other) {
    Release();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    unnamed_ = other.unnamed_;
    temporary_ = std::exchange(other.temporary_, std::string());
  }
  return *this;
}

StagedFile::~StagedFile() { Release(); }

void StagedFile::Release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temporary_.empty()) ::unlink(temporary_.c_str());
  temporary_.clear();
}

StatusOr<StagedFile> StagedFile::Write(const std::string& path, std::string_view text) {
  const std::string dir = directory_of(path);
  int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
  bool unnamed = true;
  std::string temporary;
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // The filesystem has no unnamed files (EOPNOTSUPP), or the kernel does
    // not know O_TMPFILE (EISDIR, EINVAL): the file is written under its
    // temporary name, which a kill before the rename leaves behind.
    unnamed = false;
    temporary = temporary_name(path);
    fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus("writing '" + path + "': create '" + temporary + "'", errno);
  } else if (fd < 0) {
    return ErrnoStatus("writing '" + path + "': create an unnamed file in '" + dir + "'", errno);
  }
  StagedFile staged(path, fd, unnamed, temporary);  // on an error below, closes it (and removes the name)
  const std::string what = unnamed ? "the unnamed file for '" + path + "'" : "'" + temporary + "'";
  for (std::size_t at = 0; at < text.size();) {
    const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("writing " + what, errno);
    at += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) return ErrnoStatus("fsync " + what, errno);
  return staged;
}

Status StagedFile::Publish() {
  Status status;
  if (unnamed_) {
    // Straight to its name when `path` does not exist (linkat never
    // replaces); else under a temporary name, renamed over `path`.
    int err = link_unnamed(fd_, path_);
    if (err == EEXIST) {
      temporary_ = temporary_name(path_);
      err = link_unnamed(fd_, temporary_);
      if (err == EEXIST && ::unlink(temporary_.c_str()) == 0) err = link_unnamed(fd_, temporary_);
      if (err != 0) {
        status = ErrnoStatus("writing '" + path_ + "': link the written file as '" + temporary_ + "'", err);
        temporary_.clear();  // not ours
      } else if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
        status = ErrnoStatus("rename '" + temporary_ + "' to '" + path_ + "'", errno);
      } else {
        temporary_.clear();
      }
    } else if (err != 0) {
      status = ErrnoStatus("writing '" + path_ + "': link the written file as '" + path_ + "'", err);
    }
    if (::close(std::exchange(fd_, -1)) != 0 && status.ok()) status = ErrnoStatus("close '" + path_ + "'", errno);
  } else {
    if (::close(std::exchange(fd_, -1)) != 0) {
      status = ErrnoStatus("close '" + temporary_ + "'", errno);
    } else if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
      status = ErrnoStatus("rename '" + temporary_ + "' to '" + path_ + "'", errno);
    } else {
      temporary_.clear();
    }
  }
  Release();  // removes the temporary name of a file that did not get `path`
  return status;
}

Status write_file_atomically(const std::string& path, std::string_view text) {
  ASSIGN_OR_RETURN(StagedFile staged, StagedFile::Write(path, text));
  return staged.Publish();
}

}  // namespace refit
