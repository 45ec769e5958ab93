// Opening files that must be regular files, without ever blocking.
//
// A path given by a user (a checkpoint, a shard, an index, a secret file)
// may name a FIFO, a directory, a socket or a device. open(2) of a FIFO for
// reading blocks until a writer appears, and reading a device may never
// end, before any check on the descriptor could run. open_regular_file
// opens with O_NONBLOCK (so the open itself returns at once whatever the
// file is), checks the descriptor with fstat, and refuses anything that is
// not a regular file, naming the path and what it is; only then does the
// caller read.
//
// Thread safety: free functions, no shared state.
#pragma once

#include <sys/stat.h>

#include <string>
#include <string_view>

#include "refit/status.h"

namespace refit {

// An open descriptor, closed by the destructor. Movable, not copyable.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor();

  int get() const { return fd_; }
  // Gives the descriptor up without closing it.
  int release();

 private:
  int fd_ = -1;
};

// "a regular file", "a directory", "a FIFO", "a socket", "a character
// device", "a block device", "a symbolic link" or "a file of unknown type".
std::string_view file_kind(mode_t mode);

// A regular file opened for reading, and its fstat at open.
struct RegularFile {
  FileDescriptor fd;
  struct stat st {};
};

// Opens `path` read-only if it is a regular file (following symlinks), never
// blocking. `what` names the file in errors ("safetensors file 'x'", "the
// secret file x"). Errors: open's errno (kNotFound, kPermissionDenied, ...);
// kInvalidArgument "<what> is a FIFO, not a regular file" for anything else.
StatusOr<RegularFile> open_regular_file(const std::string& path, const std::string& what);

}  // namespace refit
