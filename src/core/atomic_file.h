// Replacing a small file's content atomically: a reader (or a process that
// looks after a crash) sees the old content or the new, never a mix or a
// truncated file, and a writer killed at any moment leaves no file of its
// own behind, with one exception (below).
//
// How: the text goes into an unnamed file (O_TMPFILE) in `path`'s
// directory and is flushed to disk (fsync) while it has no name, so a kill
// there leaves nothing (the kernel frees the file with its last
// descriptor). Only then does it get a name: it is linked as `path` when
// `path` does not exist, else linked as `<path>.tmp.<pid>.<n>` and renamed
// over `path`. The exception: a kill between that link and the rename (two
// system calls) leaves the temporary name. Where the filesystem refuses
// O_TMPFILE, the file is written under the temporary name from the start
// and renamed, so a kill while it is written leaves that name too.
//
// Thread safety: free functions and a value type; two writers of one path
// race (the last rename wins), each file whole.
#pragma once

#include <string>
#include <string_view>

#include "refit/status.h"

namespace refit {

// Writes `text` to `path` atomically; an error names the path and the step
// (create, write, fsync, link, rename) and leaves no temporary file behind.
Status write_file_atomically(const std::string& path, std::string_view text);

// write_file_atomically in its two steps, for a test that ends a writer
// between them. Move-only; the destructor closes the file (and removes the
// temporary name of a file that never got its own).
class StagedFile {
 public:
  // Writes `text` into a file for `path` and flushes it to disk; `path` is
  // untouched and, unless the filesystem refused O_TMPFILE, no name in its
  // directory refers to the file.
  static StatusOr<StagedFile> Write(const std::string& path, std::string_view text);

  StagedFile(StagedFile&& other) noexcept;
  StagedFile& operator=(StagedFile&& other) noexcept;
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  ~StagedFile();

  // Gives the file the name `path`, replacing what was there. REQUIRES: not
  // published yet.
  Status Publish();

  // True when the file has no name until Publish (O_TMPFILE); false where
  // the filesystem refused it and the file sits under a temporary name.
  bool unnamed() const { return unnamed_; }
  // The descriptor of the written file (for a test that reads it through
  // /proc/PID/fd/N); -1 once published.
  int fd() const { return fd_; }

 private:
  StagedFile(std::string path, int fd, bool unnamed, std::string temporary);
  void Release();

  std::string path_;
  int fd_ = -1;
  bool unnamed_ = false;
  std::string temporary_;  // the named fallback's file; "" when unnamed
};

}  // namespace refit
