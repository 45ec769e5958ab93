// The bucket size and receive pool a job uses when the user leaves them to
// refit: RankOptions::bucket_size and EngineOptions::pool_slots are 0 (auto)
// by default, in the CLI, the Python package and the library alike.
//
// Bucket size: a pure function of the transport, so that every rank of a job
// (trainers and engines, started by anyone) derives the same plan without
// asking: 1 GiB over cuda_ipc and nccl, where each bucket pays fixed costs
// (IPC events, a kernel launch, a credit round trip) that only large buckets
// amortise; 64 MiB over shm, tcp and ucx, where per-bucket costs are small
// beside 64 MiB of copying and larger buckets gain nothing (docs/PERF.md "The
// defaults": 16 MiB serves a model of one or two buckets better, 64 MiB a
// model of gigabytes). The bucket size is an upper bound: a pool
// slot holds the plan's largest bucket (pool_slot_bytes), so a model smaller
// than one bucket costs only its own size per slot.
//
// Pool slots: 3, so that the trainer packs bucket j+1 while the engine
// applies bucket j (a third slot is worth 5-10% on GPUs, docs/PERF.md), or 2
// where the engine's --memory-limit holds only 2 slots.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

#include "refit/plan.h"

namespace refit {

// RankOptions::bucket_size and EngineOptions::pool_slots: refit chooses.
inline constexpr std::uint64_t kAutoBucketSize = 0;
inline constexpr int kAutoPoolSlots = 0;

// The bucket size auto stands for over `transport` (a name of
// transport_names(); an unknown name gets the host transports' size).
std::uint64_t default_bucket_size(std::string_view transport);

// `bucket_size` unless it is kAutoBucketSize, then default_bucket_size.
std::uint64_t effective_bucket_size(std::uint64_t bucket_size, std::string_view transport);

// Bytes one receive pool slot needs for `plan`: its largest bucket, rounded
// up to kPlanAlignment (never more than plan.bucket_size).
std::uint64_t pool_slot_bytes(const Plan& plan);

// `pool_slots` unless it is kAutoPoolSlots, then 3, or 2 when a nonzero
// `memory_limit` holds fewer than 3 slots of `slot_bytes` (whether 2 fit is
// the caller's check, which names the setting).
int effective_pool_slots(int pool_slots, std::uint64_t slot_bytes, std::uint64_t memory_limit);

}  // namespace refit
