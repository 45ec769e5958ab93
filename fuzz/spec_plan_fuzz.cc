// Fuzz target: what the coordinator does with the specs engine ranks send at
// setup (src/control/spec_json.cc, src/core/plan.cc, the aligner's
// aligned_schedule), and parse_byte_size (include/refit/plan.h) of sizes
// given on the command line.
//
// Input: byte 0: bit 0 set: the rest is a byte-size text (parse_byte_size);
// otherwise byte 1 picks the bucket size (4 KiB * (1 + byte)) and the rest is
// JSON: an array of streams, each an array of [name, dtype, [dims...]], as a
// setup's "streams". Each stream is parsed, bounded (check_plan_bounds),
// planned, and the plans aligned, as the coordinator does.
#include <string>
#include <vector>

#include "control/protocol.h"
#include "control/spec_json.h"
#include "fuzz_util.h"
#include "aligner/aligner.h"
#include "refit/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2 || size > refit::fuzz::kMaxFedBytes) return 0;
  if (data[0] & 1) {
    std::string_view text = refit::fuzz::as_text(data + 1, size - 1);
    auto bytes = refit::parse_byte_size(text);
    if (bytes.ok()) {
      // A parsed size prints, and a printed exact size parses back to itself.
      std::string printed = refit::format_bytes(*bytes);
      if (printed.find('.') == std::string::npos) {
        std::string compact;
        for (char c : printed) {
          if (c != ' ') compact.push_back(c);
        }
        auto again = refit::parse_byte_size(compact);
        if (!again.ok() || *again != *bytes) __builtin_trap();
      }
    }
    return 0;
  }
  const std::uint64_t bucket_size = refit::kMinBucketSize * (1 + static_cast<std::uint64_t>(data[1]));
  std::string_view text = refit::fuzz::as_text(data + 2, size - 2);
  auto streams = refit::parse_control_message("{\"type\":\"setup\",\"streams\":" + std::string(text) + "}", "fuzz");
  if (!streams.ok() || !refit::validate_control_message(*streams).ok()) return 0;
  std::vector<refit::Plan> plans;
  for (const refit::Json& stream : (*streams)["streams"]) {
    auto specs = refit::specs_from_json(stream, "fuzz stream");
    if (!specs.ok()) return 0;
    if (!refit::check_plan_bounds(*specs, bucket_size, "fuzz stream").ok()) return 0;
    auto plan = refit::make_plan(*specs, bucket_size);
    if (!plan.ok()) return 0;
    // The plan's own promises: every byte of every tensor is in exactly
    // one entry, and no bucket overflows.
    std::uint64_t total = 0;
    for (const refit::Bucket& b : plan->buckets) {
      if (b.bytes > bucket_size) __builtin_trap();
      for (const refit::PlanEntry& e : b.entries) total += e.bytes;
    }
    if (total != plan->total_bytes) __builtin_trap();
    (void)plan->digest_hex();
    plans.push_back(std::move(*plan));
  }
  if (plans.empty()) return 0;
  std::vector<const refit::Plan*> ptrs;
  for (const refit::Plan& p : plans) ptrs.push_back(&p);
  (void)refit::aligned_schedule(ptrs);
  return 0;
}
