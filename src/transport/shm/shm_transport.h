// shm: a one-sided transport between processes of one host, over one POSIX
// shared-memory segment per receive pool.
//
// The engine side (create_target) creates the segment "/refit-<pid>-<n>"
// (shm_open O_CREAT|O_EXCL), sizes it to slots * slot_bytes and allocates
// every page up front (posix_fallocate), so a full /dev/shm fails at setup
// with kResourceExhausted instead of a SIGBUS at the first write.
//
// Names: the pid of the creating process comes first, so a supervisor can
// sweep the leftovers of a dead process: every /dev/shm/refit-<pid>-* whose
// <pid> no longer runs (in this pid namespace) is garbage. <n> is a
// per-process counter; a name that already exists (pid reuse, or another pid
// namespace sharing /dev/shm) is skipped, never removed.
//
// Lifetime: seal() unlinks the name once every initiator has mapped the
// segment; the destructor unmaps and unlinks it if it was never sealed.
// Nothing is left in /dev/shm after a sealed target's process is killed.
//
// Descriptor: "shm:/refit-<pid>-<n>:slots=<S>:slot_bytes=<B>".
//
// The initiator (open_target) maps the segment read-write: mapped_slot gives
// the slot's address (pack in place), submit is a memcpy that completes at
// once. Visibility to the target is ordered by the kLanded frame the
// initiator sends on the data-plane link after writing.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace refit {

std::unique_ptr<Transport> make_shm_transport();

}  // namespace refit
