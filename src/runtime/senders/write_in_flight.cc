// The bucket a remote-write sender has in flight: see write_in_flight.h.
#include "runtime/senders/write_in_flight.h"

#include "runtime/senders/pack.h"

namespace refit {

void WriteInFlight::start(std::uint64_t version, std::uint64_t bucket, std::uint64_t slot, std::uint64_t encoded) {
  active_ = true;
  version_ = version;
  bucket_ = bucket;
  slot_ = slot;
  encoded_ = encoded;
  tickets_.clear();
}

Status WriteInFlight::land(const SenderContext& c, Deadline deadline) {
  if (!active_) return Status::Ok();
  RETURN_IF_ERROR(wait_written(c, tickets_, bucket_, deadline));
  active_ = false;
  if (encoded_ == 0) return c.protocol->send_landed(version_, bucket_, slot_, deadline);
  return c.protocol->send_landed_encoded(version_, bucket_, slot_, encoded_, deadline);
}

void WriteInFlight::cancel(const SenderContext& c) {
  if (active_) {
    for (Ticket t : tickets_) c.target->cancel(t);
  }
  active_ = false;
  tickets_.clear();
}

}  // namespace refit
