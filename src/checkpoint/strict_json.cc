#include "checkpoint/strict_json.h"

#include <string>
#include <unordered_set>
#include <vector>

namespace refit {
namespace {

using Json = nlohmann::json;

// Thrown from the parser callback to stop parsing at the first violation;
// caught in parse_json_strict, never escapes it.
struct StrictJsonViolation {
  std::string message;
};

// Tracks the keys of every open object. For each open object or array, its
// key in the enclosing object ("" for array elements and the root).
class KeyTracker {
 public:
  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (open_.size() >= static_cast<std::size_t>(kMaxJsonDepth)) {
          throw StrictJsonViolation{"nested deeper than " + std::to_string(kMaxJsonDepth) + " levels"};
        }
        open_.push_back(Open{event == Json::parse_event_t::object_start, pending_key_, {}});
        pending_key_.clear();
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        open_.pop_back();
        break;
      case Json::parse_event_t::key: {
        // Keys only occur inside objects, so open_ is not empty here.
        std::string key = parsed.get<std::string>();
        Open& object = open_.back();
        if (!object.keys.insert(key).second) {
          std::string where = open_.size() == 1 ? " at the top level" : " inside \"" + object.key + "\"";
          throw StrictJsonViolation{"duplicate key \"" + key + "\"" + where};
        }
        pending_key_ = std::move(key);
        break;
      }
      case Json::parse_event_t::value:
        pending_key_.clear();
        break;
    }
    return true;
  }

 private:
  struct Open {
    bool object = false;
    std::string key;  // this value's key in its parent object ("" otherwise)
    std::unordered_set<std::string> keys;
  };
  std::vector<Open> open_;
  std::string pending_key_;  // the key whose value comes next
};

}  // namespace

StatusOr<Json> parse_json_strict(std::string_view text) {
  // nlohmann stops reading at a NUL byte and ignores whatever follows, so
  // "{...}\0<anything>" would pass. JSON has no place for a raw NUL (not even
  // inside strings, where control characters must be escaped): refuse it.
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return InvalidArgument("not valid JSON: NUL byte at offset " + std::to_string(nul));
  }
  KeyTracker tracker;
  try {
    // The callback is copied into the parser; a reference wrapper keeps one tracker.
    Json::parser_callback_t cb = [&tracker](int depth, Json::parse_event_t event, Json& parsed) {
      return tracker(depth, event, parsed);
    };
    return Json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const StrictJsonViolation& v) {
    return InvalidArgument(v.message);
  } catch (const Json::exception& e) {
    // e.what(): "[json.exception.parse_error.101] parse error at line 1, column 5: ..."
    std::string what = e.what();
    if (auto close = what.find("] "); what.starts_with("[json.exception.") && close != std::string::npos) {
      what.erase(0, close + 2);
    }
    return InvalidArgument("not valid JSON: " + what);
  }
}

}  // namespace refit
