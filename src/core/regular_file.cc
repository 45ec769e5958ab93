#include "core/regular_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace refit {

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

int FileDescriptor::release() { return std::exchange(fd_, -1); }

std::string_view file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a file of unknown type";
}

StatusOr<RegularFile> open_regular_file(const std::string& path, const std::string& what) {
  // O_NONBLOCK: opening a FIFO for reading returns at once instead of
  // waiting for a writer; O_NOCTTY: a terminal never becomes ours.
  RegularFile file;
  file.fd = FileDescriptor(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (file.fd.get() < 0) return ErrnoStatus(what + ": open", errno);
  if (::fstat(file.fd.get(), &file.st) != 0) return ErrnoStatus(what + ": fstat", errno);
  if (!S_ISREG(file.st.st_mode)) {
    return InvalidArgument(what + " is " + std::string(file_kind(file.st.st_mode)) +
                           ", not a regular file (refit reads only regular files)");
  }
  // A regular file ignores O_NONBLOCK; cleared so the reads are the usual ones.
  const int flags = ::fcntl(file.fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(file.fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return ErrnoStatus(what + ": fcntl", errno);
  }
  return file;
}

}  // namespace refit
