// Replacing a small file's content atomically: a reader (or a process that
// looks after a crash) sees the old content or the new, never a mix or a
// truncated file. The text goes to a temporary file beside `path`, is
// flushed to disk, and is renamed over `path`.
//
// Thread safety: a free function; two writers of one path race (the last
// rename wins), each file whole.
#pragma once

#include <string>
#include <string_view>

#include "refit/status.h"

namespace refit {

// Writes `text` to `path` atomically; an error names the path and the step
// (create, write, fsync, rename) and leaves no temporary file behind.
Status write_file_atomically(const std::string& path, std::string_view text);

}  // namespace refit
