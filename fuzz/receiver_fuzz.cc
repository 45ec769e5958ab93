// Fuzz target: the engine side of the data plane. A Receiver
// (src/receiver/receiver.cc) with a tcp receive pool reads what a trainer
// rank sends on its data link (kData into granted slots, kLanded, kBye, or
// anything else) for refit 1 of a small fixed plan, while a consumer asks
// for batches, until the stream ends or a frame is refused.
//
// Input: byte 0 % 3 is the number of buckets (0..2) sent correctly first
// (their slots are granted at start), so the fuzzer also explores what
// follows a valid prefix; the rest is appended as the trainer's bytes.
#include <chrono>
#include <string>

#include "fuzz_util.h"
#include "refit/plan.h"
#include "receiver/receiver.h"
#include "transport/transport.h"

namespace {

using namespace refit;

const Plan& TestPlan() {
  static const Plan plan = [] {
    std::vector<TensorSpec> specs = {{"a", DType::kBFloat16, {32, 32}},
                                     {"b", DType::kFloat32, {100}},
                                     {"c", DType::kBFloat16, {4096}},
                                     {"d", DType::kInt8, {3}}};
    auto p = make_plan(specs, 4096);
    if (!p.ok()) __builtin_trap();
    return *p;
  }();
  return plan;
}

std::string Header(FrameType type, std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d,
                   std::uint64_t payload) {
  std::string out;
  auto put = [&](std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  };
  put(kFrameMagic, 4);
  put(static_cast<std::uint16_t>(type), 2);
  put(0, 2);
  for (std::uint64_t v : {a, b, c, d, payload}) put(v, 8);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0 || size > fuzz::kMaxFedBytes / 2) return 0;
  const Plan& plan = TestPlan();
  std::string stream;
  const std::size_t valid = data[0] % 3;
  for (std::size_t j = 0; j < valid && j < plan.buckets.size(); ++j) {
    const std::uint64_t bytes = plan.buckets[j].bytes;
    stream += Header(FrameType::kData, 1, /*slot=*/j, /*offset=*/0, 0, bytes) + std::string(bytes, 'x');
    stream += Header(FrameType::kLanded, 1, /*bucket=*/j, /*slot=*/j, bytes, 0);
  }
  stream.append(reinterpret_cast<const char*>(data + 1), size - 1);

  static auto transport = make_transport("tcp");
  if (!transport.ok()) __builtin_trap();
  PoolOptions pool_options;
  pool_options.slots = 2;
  pool_options.slot_bytes = plan.bucket_size;
  pool_options.owner = "engine rank 0";
  auto pool = (*transport)->create_target(pool_options);
  if (!pool.ok()) __builtin_trap();
  ReceiverOptions options;
  options.name = "engine rank 0";
  options.poison_recycled = true;
  auto receiver = Receiver::Create(&plan, 0, std::move(*pool), options);
  if (!receiver.ok()) __builtin_trap();
  fuzz::FedLink fed(stream);
  (*receiver)->attach_link(fed.release());
  const auto deadline = Deadline::After(std::chrono::seconds(5));
  if (!(*receiver)->start(1, deadline).ok()) return 0;
  for (;;) {
    auto batch = (*receiver)->next(deadline);
    if (!batch.ok() || !batch->has_value()) break;
    for (const TensorView& t : (*batch)->tensors) {
      // Every view lies inside memory the receiver owns (ASan checks).
      const std::uint64_t n = t.spec->nbytes();
      if (n > 0) {
        volatile std::byte first = t.data[0], last = t.data[n - 1];
        (void)first;
        (void)last;
      }
    }
  }
  return 0;
}
