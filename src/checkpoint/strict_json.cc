#include "checkpoint/strict_json.h"

#include <string>
#include <unordered_set>
#include <vector>

namespace refit {
namespace {

using Json = nlohmann::json;

// A SAX pass over the text that builds nothing: it tracks the keys of every
// open object and the nesting depth, and stops at the first violation. (A
// parser callback on the DOM parser would do the same in one pass, but
// nlohmann's callback parser rescans the parent object at the end of every
// child object: quadratic in the tensor count, seconds for a large header.)
class KeyChecker {
 public:
  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(Json::number_integer_t) { return value(); }
  bool number_unsigned(Json::number_unsigned_t) { return value(); }
  bool number_float(Json::number_float_t, const Json::string_t&) { return value(); }
  bool string(Json::string_t&) { return value(); }
  bool binary(Json::binary_t&) { return value(); }
  bool start_object(std::size_t) { return open(); }
  bool start_array(std::size_t) { return open(); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(Json::string_t& key) {
    // Keys only occur inside objects, so open_ is not empty here.
    Open& object = open_.back();
    if (!object.keys.insert(key).second) {
      violation = "duplicate key \"" + key + "\"" +
                  (open_.size() == 1 ? std::string(" at the top level") : " inside \"" + object.key + "\"");
      return false;
    }
    pending_key_ = key;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const Json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ..."
    std::string what = e.what();
    if (auto close = what.find("] "); what.starts_with("[json.exception.") && close != std::string::npos) {
      what.erase(0, close + 2);
    }
    violation = "not valid JSON: " + what;
    return false;
  }

  std::string violation;  // set when the pass stopped early

 private:
  struct Open {
    std::string key;  // this value's key in its parent object ("" otherwise)
    std::unordered_set<std::string> keys;
  };
  bool value() {
    pending_key_.clear();
    return true;
  }
  bool open() {
    if (open_.size() >= static_cast<std::size_t>(kMaxJsonDepth)) {
      violation = "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
      return false;
    }
    open_.push_back(Open{std::move(pending_key_), {}});
    pending_key_.clear();
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

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
  KeyChecker checker;
  const bool clean = Json::sax_parse(text.begin(), text.end(), &checker, Json::input_format_t::json,
                                     /*strict=*/true, /*ignore_comments=*/false);
  if (!clean) return InvalidArgument(checker.violation.empty() ? std::string("not valid JSON") : checker.violation);
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {  // not expected: the SAX pass accepted the same text
    return InvalidArgument(std::string("not valid JSON: ") + e.what());
  }
}

}  // namespace refit
