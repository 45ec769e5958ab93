// Test helper: environment variables set for one scope.
#pragma once

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

namespace refit::testing {

// Sets environment variables for as long as it lives (processes forked
// meanwhile inherit them), then gives each back its previous value, or
// removes it where it had none. Not thread-safe (setenv is process-wide):
// tests use it from their main thread, before starting the threads or
// processes that read the variables.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old != nullptr ? std::optional<std::string>(old) : std::nullopt;
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ScopedEnv(const std::string& name, const std::string& value) : ScopedEnv(std::map<std::string, std::string>{{name, value}}) {}
  ~ScopedEnv() {
    for (const auto& [name, old] : saved_) {
      if (old) {
        ::setenv(name.c_str(), old->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace refit::testing
