#include "transport/host_pool.h"

#include <sys/mman.h>

#include "transport/pool_layout.h"

namespace refit {

std::string SlotShape::text() const {
  return "(slots=" + std::to_string(slots) + ", slot_bytes=" + std::to_string(slot_bytes) + ")";
}

Status SlotShape::range_error(std::string_view what, std::int64_t slot, std::uint64_t offset,
                              std::uint64_t bytes) const {
  return InvalidArgument("write of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                         " into slot " + std::to_string(slot) + " of " + std::string(what) +
                         " is out of range " + text());
}

HostPool::~HostPool() { ::munmap(base_, static_cast<std::size_t>(shape_.slots) * shape_.slot_bytes); }

std::byte* HostPool::slot(std::int64_t i) const {
  if (i < 0 || i >= shape_.slots) return nullptr;
  return base_ + static_cast<std::uint64_t>(i) * shape_.slot_bytes;
}

StatusOr<bool> ImmediateTickets::poll(Ticket ticket, std::string_view target) const {
  if (ticket >= next_) {
    return InvalidArgument("poll of unknown ticket " + std::to_string(ticket) + " on " + std::string(target));
  }
  return true;
}

Status require_host_memory(std::string_view transport, const PoolOptions& options) {
  if (options.memory == MemoryKind::kHost) return Status::Ok();
  return FailedPrecondition(std::string(transport) + " transport cannot hold " + pool_owner(options) +
                            "'s receive pool in CUDA memory (memory=cuda); use host memory or a "
                            "transport with device_memory");
}

Status cannot_expose_memory(std::string_view transport) {
  return FailedPrecondition("transport " + std::string(transport) +
                            " cannot expose existing memory (direct mode needs cuda_ipc)");
}

}  // namespace refit
