// Uses the installed public API only: plans a stream, lands one engine
// rank's weights through the Engine contract of a ReferenceEngine and checks
// every byte. Prints "consumer ok" and exits 0 when all of it held.
#include <cstdio>
#include <cstring>
#include <vector>

#include "refit/batch.h"
#include "refit/plan.h"
#include "refit/reference_engine.h"
#include "refit/status.h"

int main() {
  using namespace refit;
  std::vector<TensorSpec> specs = {{"w.weight", DType::kBFloat16, {64, 32}}, {"w.bias", DType::kFloat32, {64}}};
  StatusOr<Plan> plan = make_plan(specs, 4 << 10);
  if (!plan.ok()) {
    std::fprintf(stderr, "consumer: %s\n", plan.status().ToString().c_str());
    return 1;
  }
  StatusOr<std::unique_ptr<ReferenceEngine>> engine = ReferenceEngine::Create({specs}, {0});
  if (!engine.ok()) {
    std::fprintf(stderr, "consumer: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  std::vector<std::vector<std::byte>> bytes;
  AlignedBatch batch;
  batch.payload.resize(1);
  for (const TensorSpec& spec : specs) {
    bytes.emplace_back(spec.nbytes());
    for (std::size_t i = 0; i < bytes.back().size(); ++i) bytes.back()[i] = std::byte(i * 7 + spec.name.size());
  }
  for (std::size_t i = 0; i < specs.size(); ++i) {
    batch.specs.push_back(&specs[i]);
    batch.payload[0].push_back(TensorView{&specs[i], bytes[i].data(), MemoryKind::kHost, -1});
  }
  Engine& e = **engine;
  Status st = e.begin(1);
  if (st.ok()) st = e.apply(batch);
  if (st.ok()) st = e.commit(1);
  if (!st.ok()) {
    std::fprintf(stderr, "consumer: %s\n", st.ToString().c_str());
    return 1;
  }
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (std::memcmp((*engine)->weight(0, specs[i].name), bytes[i].data(), bytes[i].size()) != 0) {
      std::fprintf(stderr, "consumer: %s differs after apply\n", specs[i].name.c_str());
      return 1;
    }
  }
  std::printf("consumer ok: plan %s, %zu buckets, weight version %llu\n", plan->digest_hex().c_str(),
              plan->buckets.size(), static_cast<unsigned long long>(e.weight_version()));
  return 0;
}
