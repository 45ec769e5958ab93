// Log: where refit's own messages go.
//
// The library never writes to stderr by itself: every warning and notice
// (a rank recovered, a refused connection, a transport's fallback, the
// coordinator's joins and progress) goes through log(). By default the sink
// writes "<source>: <message>" as one line to stderr; a program that routes
// its messages elsewhere (the Python binding into Python's `logging`)
// installs its own sink with set_log_sink.
//
// `source` names who speaks: "refit coordinator", "trainer rank 2",
// "engine rank 0", "refit cuda_ipc", ... A message is one line without the
// trailing newline; the progress bar is the one exception (LogLevel::kProgress:
// a line redrawn in place, written as it is, without source or newline, by
// the default sink).
//
// Thread safety: log() may be called from any thread; the sink is called
// under a lock, one message at a time. set_log_sink may be called at any
// time; a message in flight goes to the sink that was installed when it
// started.
#pragma once

#include <functional>
#include <string_view>

namespace refit {

enum class LogLevel {
  kInfo,      // progress of long work, setup notes (registered N GB in T s)
  kWarning,   // something degraded but the job goes on (a fallback, a refused stranger)
  kError,     // a failure the caller will also see as a Status
  kProgress,  // a progress line redrawn in place ("\r...")
};

// "info", "warning", "error", "progress".
std::string_view log_level_name(LogLevel level);

using LogSink = std::function<void(LogLevel level, std::string_view source, std::string_view message)>;

// Installs `sink` for every later message; an empty sink restores the
// default (stderr).
void set_log_sink(LogSink sink);

// Sends one message to the installed sink.
void log(LogLevel level, std::string_view source, std::string_view message);

}  // namespace refit
