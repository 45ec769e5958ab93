// What the host-memory transports (shm, tcp) share: a pool of `slots` slots
// of `slot_bytes` each in one mapping of host memory, its slot views and
// range checks, the target base class built on it, and the tickets of an
// initiator whose writes complete before submit returns.
//
// Private to src/transport. A transport that keeps its pool elsewhere (CUDA
// memory, UCX-registered memory) does not use this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "refit/status.h"
#include "transport/transport.h"

namespace refit {

// The shape of a pool: `slots` slots of `slot_bytes` each, and the range
// checks every write into it goes through.
struct SlotShape {
  int slots = 0;
  std::uint64_t slot_bytes = 0;

  // True when [offset, offset + bytes) lies inside slot `slot`.
  bool contains(std::int64_t slot, std::uint64_t offset, std::uint64_t bytes) const {
    return slot >= 0 && slot < slots && offset <= slot_bytes && bytes <= slot_bytes - offset;
  }
  // "(slots=S, slot_bytes=B)", for errors.
  std::string text() const;
  // kInvalidArgument "write of N bytes at offset O into slot S of <what> is
  // out of range (slots=.., slot_bytes=..)".
  Status range_error(std::string_view what, std::int64_t slot, std::uint64_t offset, std::uint64_t bytes) const;
};

// One mapping of slots * slot_bytes host bytes, unmapped (munmap) when the
// HostPool goes. Slot i starts at base + i * slot_bytes.
class HostPool {
 public:
  // Takes the mapping at `base` (from mmap, slots * slot_bytes bytes).
  HostPool(std::byte* base, SlotShape shape) : base_(base), shape_(shape) {}
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  const SlotShape& shape() const { return shape_; }
  // Slot i's first byte, or nullptr when i is not a slot.
  std::byte* slot(std::int64_t i) const;

 private:
  std::byte* base_;
  SlotShape shape_;
};

// A receive pool in host memory: the slot bookkeeping of TargetMemory, done
// once. Subclasses add the descriptor, how data arrives (receive_data) and
// what sealing means.
class HostPoolTarget : public TargetMemory {
 public:
  // `owner`: the pool's owner as errors name it (pool_owner()).
  HostPoolTarget(std::string owner, std::byte* base, SlotShape shape)
      : owner_(std::move(owner)), pool_(base, shape) {}

  int slots() const final { return pool_.shape().slots; }
  std::uint64_t slot_bytes() const final { return pool_.shape().slot_bytes; }
  MemoryKind memory() const final { return MemoryKind::kHost; }
  int device() const final { return -1; }
  std::byte* slot(int i) final { return pool_.slot(i); }

 protected:
  const std::string& owner() const { return owner_; }
  const HostPool& pool() const { return pool_; }

 private:
  std::string owner_;
  HostPool pool_;
};

// Tickets of an initiator whose submit finishes the write before it
// returns (a memcpy into a mapping, a frame written to the socket): every
// ticket handed out is done; polling one never handed out is an error.
class ImmediateTickets {
 public:
  Ticket next() { return next_++; }
  // True for a ticket handed out; kInvalidArgument naming `target` for
  // any other.
  StatusOr<bool> poll(Ticket ticket, std::string_view target) const;

 private:
  Ticket next_ = 0;
};

// Refusals every host-pool transport gives in the same words.
// kFailedPrecondition when `options` asks for CUDA memory.
Status require_host_memory(std::string_view transport, const PoolOptions& options);
// expose_memory: direct mode needs a transport that maps device memory.
Status cannot_expose_memory(std::string_view transport);

}  // namespace refit
