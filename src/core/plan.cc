#include "refit/plan.h"

#include "refit/partial.h"
#include "refit/transfer_defaults.h"

#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>

namespace refit {
namespace {

constexpr std::string_view kPlanFormatTag = "refit-plan-v1";

std::uint64_t align_up(std::uint64_t n) { return (n + kPlanAlignment - 1) / kPlanAlignment * kPlanAlignment; }

// A bucket being filled: entries in stream (insertion) order, offsets not yet
// assigned.
struct OpenBucket {
  std::vector<PlanEntry> entries;
  std::uint64_t aligned_bytes = 0;  // sum of align_up(entry bytes)
};

// Lays out the entries of `open` grouped by dtype (groups in order of first
// appearance, stream order inside a group), each at a multiple of
// kPlanAlignment, and appends the bucket to `plan`.
void close_bucket(OpenBucket& open, Plan& plan) {
  if (open.entries.empty()) return;
  Bucket bucket;
  std::vector<DType> group_order;
  for (const PlanEntry& e : open.entries) {
    DType d = plan.specs[e.tensor].dtype;
    if (std::find(group_order.begin(), group_order.end(), d) == group_order.end()) group_order.push_back(d);
  }
  std::uint64_t cursor = 0;
  for (DType d : group_order) {
    for (const PlanEntry& e : open.entries) {
      if (plan.specs[e.tensor].dtype != d) continue;
      PlanEntry placed = e;
      placed.bucket_offset = cursor;
      cursor += align_up(e.bytes);
      // End of the last entry that holds bytes; a 0-byte entry adds nothing.
      if (placed.bytes > 0) bucket.bytes = placed.bucket_offset + placed.bytes;
      bucket.entries.push_back(placed);
    }
  }
  for (const PlanEntry& e : open.entries) {
    if (e.tensor_offset + e.bytes == plan.specs[e.tensor].nbytes()) bucket.completes.push_back(e.tensor);
  }
  plan.buckets.push_back(std::move(bucket));
  open = OpenBucket{};
}

// Canonical little-endian encoding for the digest.
class Encoder {
 public:
  void u8(std::uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void bytes(std::string_view s) {
    u64(s.size());
    out_.append(s);
  }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

std::uint64_t compute_digest(const Plan& plan) {
  Encoder enc;
  enc.bytes(kPlanFormatTag);
  enc.u64(plan.bucket_size);
  enc.u64(plan.specs.size());
  for (const TensorSpec& s : plan.specs) {
    enc.bytes(s.name);
    enc.u8(static_cast<std::uint8_t>(s.dtype));
    enc.u64(s.shape.size());
    for (std::int64_t d : s.shape) enc.u64(static_cast<std::uint64_t>(d));
  }
  enc.u64(plan.buckets.size());
  for (const Bucket& b : plan.buckets) {
    enc.u64(b.bytes);
    enc.u64(b.entries.size());
    for (const PlanEntry& e : b.entries) {
      enc.u64(e.tensor);
      enc.u64(e.tensor_offset);
      enc.u64(e.bytes);
      enc.u64(e.bucket_offset);
    }
    enc.u64(b.completes.size());
    for (std::uint32_t t : b.completes) enc.u64(t);
  }
  return XXH64(enc.str().data(), enc.str().size(), 0);
}

// Lays out the buckets of `plan` (its specs and bucket_size set): each
// tensor `selected` holds (null: every one) in stream order, a tensor above
// bucket_size in chunks of bucket_size, the others packed greedily into
// buckets that close before their aligned bytes pass `limit`.
void lay_out(Plan& plan, const std::vector<bool>* selected, std::uint64_t limit) {
  const std::uint64_t bucket_size = plan.bucket_size;
  OpenBucket open;
  for (std::size_t i = 0; i < plan.specs.size(); ++i) {
    if (selected != nullptr && !(*selected)[i]) continue;
    const auto t = static_cast<std::uint32_t>(i);
    const std::uint64_t nbytes = plan.specs[i].nbytes();
    if (nbytes > bucket_size) {
      close_bucket(open, plan);
      plan.largest_chunked_tensor = std::max(plan.largest_chunked_tensor, nbytes);
      const std::uint64_t full_chunks = (nbytes - 1) / bucket_size;  // chunks before the last one
      for (std::uint64_t k = 0; k < full_chunks; ++k) {
        open.entries.push_back(PlanEntry{t, k * bucket_size, bucket_size, 0});
        open.aligned_bytes = bucket_size;
        close_bucket(open, plan);
      }
      const std::uint64_t last_offset = full_chunks * bucket_size;
      open.entries.push_back(PlanEntry{t, last_offset, nbytes - last_offset, 0});
      open.aligned_bytes = align_up(nbytes - last_offset);
      continue;
    }
    const std::uint64_t need = align_up(nbytes);
    if (open.aligned_bytes + need > limit) close_bucket(open, plan);
    open.entries.push_back(PlanEntry{t, 0, nbytes, 0});
    open.aligned_bytes += need;
  }
  close_bucket(open, plan);
}


}  // namespace

std::string Plan::digest_hex() const {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, digest);
  return buf;
}

StatusOr<Plan> make_plan(std::vector<TensorSpec> specs, std::uint64_t bucket_size) {
  if (specs.empty()) {
    return InvalidArgument("the stream is empty: an engine rank must receive at least one tensor");
  }
  if (bucket_size < kMinBucketSize || bucket_size % kPlanAlignment != 0) {
    return InvalidArgument("bucket_size " + std::to_string(bucket_size) + " (" + format_bytes(bucket_size) +
                           ") is invalid: it must be at least " + std::to_string(kMinBucketSize) +
                           " bytes and a multiple of " + std::to_string(kPlanAlignment));
  }
  if (specs.size() > std::numeric_limits<std::uint32_t>::max()) {
    return InvalidArgument("the stream has " + std::to_string(specs.size()) + " tensors; at most " +
                           std::to_string(std::numeric_limits<std::uint32_t>::max()) + " are supported");
  }
  Plan plan;
  plan.bucket_size = bucket_size;
  std::unordered_map<std::string_view, std::size_t> seen;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    Status s = validate_spec(specs[i]);
    if (!s.ok()) return s.WithContext("stream position " + std::to_string(i));
    auto [it, inserted] = seen.emplace(specs[i].name, i);
    if (!inserted) {
      return InvalidArgument("duplicate tensor name '" + specs[i].name + "' at stream positions " +
                             std::to_string(it->second) + " and " + std::to_string(i));
    }
    std::uint64_t nbytes = specs[i].nbytes();
    if (__builtin_add_overflow(plan.total_bytes, nbytes, &plan.total_bytes)) {
      return InvalidArgument("the stream's total byte size overflows 64 bits at tensor '" + specs[i].name + "'");
    }
  }
  plan.specs = std::move(specs);
  lay_out(plan, nullptr, bucket_size);
  plan.digest = compute_digest(plan);
  return plan;
}

StatusOr<Plan> make_subset_plan(const Plan& full, const std::vector<bool>& selected) {
  if (selected.size() != full.specs.size()) {
    return InvalidArgument("partial refit: a selection of " + std::to_string(selected.size()) +
                           " tensors for a stream of " + std::to_string(full.specs.size()));
  }
  if (std::find(selected.begin(), selected.end(), false) == selected.end()) return full;
  if (std::find(selected.begin(), selected.end(), true) == selected.end()) {
    return InvalidArgument("partial refit: the selection holds none of the stream's tensors");
  }
  Plan plan;
  plan.specs = full.specs;
  plan.bucket_size = full.bucket_size;
  for (std::size_t i = 0; i < selected.size(); ++i) plan.total_bytes += selected[i] ? full.specs[i].nbytes() : 0;
  lay_out(plan, &selected, pool_slot_bytes(full));
  plan.digest = compute_digest(plan);
  return plan;
}


StatusOr<std::uint64_t> parse_byte_size(std::string_view text) {
  const std::string quoted = "'" + std::string(text) + "'";
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) return InvalidArgument("byte size " + quoted + " is empty");
  if (s.front() == '-') return InvalidArgument("byte size " + quoted + " is negative");
  if (s.front() == '+') s.remove_prefix(1);
  std::uint64_t value = 0;
  std::size_t i = 0;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) {
    if (__builtin_mul_overflow(value, 10u, &value) ||
        __builtin_add_overflow(value, static_cast<std::uint64_t>(s[i] - '0'), &value)) {
      return InvalidArgument("byte size " + quoted + " overflows 64 bits");
    }
  }
  if (i == 0) return InvalidArgument("byte size " + quoted + " does not start with a number");
  std::string_view suffix = s.substr(i);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
  std::string lower;
  for (char c : suffix) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::pair<std::string_view, std::uint64_t> kUnits[] = {
      {"", 1},
      {"b", 1},
      {"kib", 1ull << 10},
      {"mib", 1ull << 20},
      {"gib", 1ull << 30},
      {"tib", 1ull << 40},
      {"pib", 1ull << 50},  // format_bytes prints these for 1024 TiB and up
      {"eib", 1ull << 60},
      {"kb", 1000ull},
      {"mb", 1000ull * 1000},
      {"gb", 1000ull * 1000 * 1000},
      {"tb", 1000ull * 1000 * 1000 * 1000},
      {"pb", 1000ull * 1000 * 1000 * 1000 * 1000},
      {"eb", 1000ull * 1000 * 1000 * 1000 * 1000 * 1000},
  };
  for (const auto& [name, mult] : kUnits) {
    if (lower != name) continue;
    std::uint64_t out = 0;
    if (__builtin_mul_overflow(value, mult, &out)) {
      return InvalidArgument("byte size " + quoted + " overflows 64 bits");
    }
    return out;
  }
  return InvalidArgument("byte size " + quoted + " has an unknown unit '" + std::string(suffix) +
                         "' (use B, KiB, MiB, GiB, TiB, PiB, EiB, KB, MB, GB, TB, PB or EB)");
}

std::string format_bytes(std::uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  int unit = 0;
  std::uint64_t scale = 1024;
  while (unit + 1 < 6 && bytes / scale >= 1024) {
    scale *= 1024;
    ++unit;
  }
  char buf[64];
  if (bytes % scale == 0) {
    std::snprintf(buf, sizeof(buf), "%" PRIu64 " %s", bytes / scale, kUnits[unit]);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", static_cast<double>(bytes) / static_cast<double>(scale),
                  kUnits[unit]);
  }
  return buf;
}

}  // namespace refit
