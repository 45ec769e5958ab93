#include "checkpoint/json_member_stream.h"

#include <unordered_set>
#include <utility>
#include <vector>

#include "checkpoint/strict_json.h"

namespace refit {
namespace {

using Json = nlohmann::json;

// A SAX handler: depth 1 is the top-level object (never built); each of its
// members' values is built as a small DOM in `value_` and handed over when
// it closes.
class MemberStream {
 public:
  MemberStream(std::size_t max_members, const std::string& too_many, const JsonMemberFn& on_member)
      : max_members_(max_members), too_many_(too_many), on_member_(on_member) {}

  bool null() { return scalar(Json(nullptr)); }
  bool boolean(bool v) { return scalar(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return scalar(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return scalar(Json(v)); }
  bool number_float(Json::number_float_t v, const Json::string_t&) { return scalar(Json(v)); }
  bool string(Json::string_t& v) { return scalar(Json(std::move(v))); }
  bool binary(Json::binary_t&) { return fail("not valid JSON: binary value"); }
  bool start_object(std::size_t) { return open(Json::object()); }
  bool start_array(std::size_t) {
    if (depth_ == 0) return fail("it is not a JSON object");
    return open(Json::array());
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(Json::string_t& key) {
    if (depth_ == 1) {
      if (!top_keys_.insert(key).second) return fail("duplicate key \"" + key + "\" at the top level");
      if (top_keys_.size() > max_members_) return fail(too_many_);
      member_key_ = key;
    } else if (open_.back().value->contains(key)) {
      return fail("duplicate key \"" + key + "\" inside \"" + open_.back().key + "\"");
    }
    pending_key_ = std::move(key);
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const Json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ..."
    std::string what = e.what();
    if (auto end = what.find("] "); what.starts_with("[json.exception.") && end != std::string::npos) {
      what.erase(0, end + 2);
    }
    return fail("not valid JSON: " + what);
  }

  std::string violation;     // set when the JSON broke a rule
  Status member_error;       // set when on_member refused a member

 private:
  struct Open {
    Json* value;
    std::string key;  // its key in its parent object ("" inside an array)
  };

  bool fail(std::string why) {
    violation = std::move(why);
    return false;
  }

  // Adds `v` to the innermost open container and returns where it lives.
  Json* add(Json v) {
    Json& parent = *open_.back().value;
    if (parent.is_object()) return &(parent[pending_key_] = std::move(v));
    parent.push_back(std::move(v));
    return &parent.back();
  }

  bool open(Json v) {
    if (depth_ >= kMaxJsonDepth) return fail("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    ++depth_;
    if (depth_ == 1) return true;  // the top-level object itself
    Json* at = nullptr;
    if (depth_ == 2) {
      value_ = std::move(v);
      at = &value_;
    } else {
      at = add(std::move(v));
    }
    open_.push_back(Open{at, depth_ == 2 || open_.back().value->is_object() ? pending_key_ : std::string()});
    pending_key_.clear();
    return true;
  }

  bool close() {
    --depth_;
    if (depth_ == 0) return true;
    open_.pop_back();
    return depth_ == 1 ? emit() : true;
  }

  bool scalar(Json v) {
    if (depth_ == 0) return fail("it is not a JSON object");
    if (depth_ == 1) {
      value_ = std::move(v);
      return emit();
    }
    add(std::move(v));
    return true;
  }

  // One member is complete: hand it over, then drop it.
  bool emit() {
    member_error = on_member_(member_key_, value_);
    value_ = Json();
    return member_error.ok();
  }

  std::size_t max_members_;
  const std::string& too_many_;
  const JsonMemberFn& on_member_;
  int depth_ = 0;
  std::unordered_set<std::string> top_keys_;
  std::string member_key_;   // the top-level member being built
  std::string pending_key_;  // the key whose value comes next
  Json value_;               // that member's value
  std::vector<Open> open_;   // containers open inside value_
};

}  // namespace

Status stream_json_members(std::string_view text, std::size_t max_members, const std::string& too_many,
                           const std::string& prefix, const JsonMemberFn& on_member) {
  // nlohmann stops reading at a NUL byte and ignores the rest (strict_json.h).
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return InvalidArgument(prefix + "not valid JSON: NUL byte at offset " + std::to_string(nul));
  }
  MemberStream stream(max_members, too_many, on_member);
  const bool clean = Json::sax_parse(text.begin(), text.end(), &stream, Json::input_format_t::json,
                                     /*strict=*/true, /*ignore_comments=*/false);
  if (!stream.member_error.ok()) return stream.member_error;
  if (!clean) return InvalidArgument(prefix + (stream.violation.empty() ? std::string("not valid JSON") : stream.violation));
  return Status::Ok();
}

}  // namespace refit
