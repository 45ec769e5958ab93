#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace refit {

Status write_file_atomically(const std::string& path, std::string_view text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("writing '" + path + "': create '" + tmp + "'", errno);
  Status status;
  for (std::size_t at = 0; at < text.size() && status.ok();) {
    const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) status = ErrnoStatus("writing '" + tmp + "'", errno);
    if (n > 0) at += static_cast<std::size_t>(n);
  }
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoStatus("fsync '" + tmp + "'", errno);
  if (::close(fd) != 0 && status.ok()) status = ErrnoStatus("close '" + tmp + "'", errno);
  if (status.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus("rename '" + tmp + "' to '" + path + "'", errno);
  }
  if (!status.ok()) ::unlink(tmp.c_str());
  return status;
}

}  // namespace refit
