// Helpers of the nccl communicator (nccl_communicator.h).
#include "transport/nccl/nccl_communicator.h"

#if REFIT_HAVE_NCCL

#include <poll.h>

#include <cstdio>
#include <string>

#include "net/poll_wait.h"

namespace refit::nccl_internal {

std::string pointer_text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

bool in_range(std::uint64_t slot, std::uint64_t offset, std::uint64_t bytes, int slots, std::uint64_t slot_bytes) {
  return slot < static_cast<std::uint64_t>(slots) && offset <= slot_bytes && bytes <= slot_bytes - offset;
}

std::string pool_shape(int slots, std::uint64_t slot_bytes) {
  return "(slots=" + std::to_string(slots) + ", slot_bytes=" + std::to_string(slot_bytes) + ")";
}

std::string nccl_error_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = std::string(ncclGetErrorString(r)) + " (ncclResult " + std::to_string(static_cast<int>(r)) + ")";
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') s += ": " + std::string(last);
  return s;
}

StatusCode nccl_code(ncclResult_t r) {
  switch (r) {
    case ncclRemoteError:
    case ncclSystemError: return StatusCode::kUnavailable;
    case ncclInvalidArgument:
    case ncclInvalidUsage: return StatusCode::kFailedPrecondition;
    default: return StatusCode::kInternal;
  }
}

bool link_lost(const Link& link) {
  pollfd p{link.fd(), POLLRDHUP, 0};
  return poll_until({&p, 1}, Deadline::After(std::chrono::milliseconds(0))) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace refit::nccl_internal

#endif  // REFIT_HAVE_NCCL
