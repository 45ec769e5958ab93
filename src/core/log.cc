#include "refit/log.h"

#include <cstdio>
#include <memory>
#include <mutex>
#include <utility>

namespace refit {
namespace {

std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}

// The installed sink; null: the default (stderr).
std::shared_ptr<LogSink>& installed_sink() {
  static std::shared_ptr<LogSink> sink;
  return sink;
}

void write_to_stderr(LogLevel level, std::string_view source, std::string_view message) {
  if (level == LogLevel::kProgress) {  // redrawn in place: the message alone
    std::fprintf(stderr, "%.*s", static_cast<int>(message.size()), message.data());
  } else {
    std::fprintf(stderr, "%.*s: %.*s\n", static_cast<int>(source.size()), source.data(),
                 static_cast<int>(message.size()), message.data());
  }
  std::fflush(stderr);
}

}  // namespace

std::string_view log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
    case LogLevel::kProgress: return "progress";
  }
  return "unknown";
}

void set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  installed_sink() = sink ? std::make_shared<LogSink>(std::move(sink)) : nullptr;
}

void log(LogLevel level, std::string_view source, std::string_view message) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  const std::shared_ptr<LogSink>& sink = installed_sink();
  if (sink) {
    (*sink)(level, source, message);
  } else {
    write_to_stderr(level, source, message);
  }
}

}  // namespace refit
