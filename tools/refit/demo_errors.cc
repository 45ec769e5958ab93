#include "demo_errors.h"

namespace refit::cli {
namespace {

constexpr std::string_view kCommandPrefix = "refit ";
constexpr std::string_view kErrorMark = ": error: ";

// `text` less a leading status code ("failed_precondition: ") and less one
// leading "`name`: " context.
std::string_view core_of(std::string_view text, const std::string& name) {
  const auto colon = text.find(": ");
  if (colon != std::string_view::npos && colon > 0 && text.substr(0, colon).find_first_not_of("abcdefghijklmnopqrstuvwxyz_") ==
                                             std::string_view::npos) {
    text.remove_prefix(colon + 2);
  }
  if (!name.empty() && text.starts_with(name + ": ")) text.remove_prefix(name.size() + 2);
  return text;
}

}  // namespace

std::optional<ErrorLine> parse_error_line(std::string_view whole) {
  if (!whole.starts_with(kCommandPrefix)) return std::nullopt;
  std::string_view line = whole.substr(kCommandPrefix.size());
  const auto mark = line.find(kErrorMark);
  // The command is one word: "refit engine: error: ", never a log line such
  // as "refit coordinator: engine rank 0: error: ...".
  if (mark == std::string_view::npos || mark == 0 || line.substr(0, mark).find(' ') != std::string_view::npos) {
    return std::nullopt;
  }
  return ErrorLine{std::string(whole), std::string(line.substr(mark + kErrorMark.size()))};
}

bool may_become_error_line(std::string_view line) {
  if (line.find('\r') != std::string_view::npos) return false;  // a progress bar redrawn in place
  return line.size() < kCommandPrefix.size() ? kCommandPrefix.starts_with(line) : line.starts_with(kCommandPrefix);
}

std::string naming_process(const std::string& error, const std::string& name) {
  if (error.find(name) != std::string::npos) return error;
  const std::string_view core = core_of(error, "");
  return error.substr(0, error.size() - core.size()) + name + ": " + std::string(core);
}

bool repeats_cause(const std::string& error, const std::string& name, const Cause& cause) {
  const std::string_view core = core_of(error, name);
  if (cause.process.empty() && core.find("coordinator") != std::string_view::npos) return true;
  return core.find(core_of(cause.text, cause.process)) != std::string_view::npos;
}

}  // namespace refit::cli
