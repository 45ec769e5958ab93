// shm: a one-sided transport between processes of one host, over one shared
// memory segment per receive pool that is never named in any file system.
//
// The engine side (create_target) creates an unnamed tmpfs file in /dev/shm
// (O_TMPFILE; a memfd where /dev/shm cannot), sizes it to slots * slot_bytes
// and allocates every page up front (posix_fallocate), so a full /dev/shm
// fails at setup with kResourceExhausted instead of a SIGBUS at the first
// write. It then hands the segment's descriptor to initiators over the
// abstract Unix socket "@refit-<pid>-<n>" (fd_handoff.h; same user only).
//
// Why unnamed: a named segment is left in /dev/shm when its process is
// killed before removing the name, and an engine killed during setup, before
// every trainer had opened it, did just that. An unnamed file and an
// abstract socket both vanish with the process, so a kill at any moment,
// setup included, leaves nothing in /dev/shm or /tmp. The cost: both sides
// must share a network namespace (abstract sockets are per namespace).
//
// Names: "@refit-<pid>-<n>", the creating pid first; <n> is a per-process
// counter; a name already bound (pid reuse, another pid namespace) is
// skipped.
//
// Lifetime: seal() stops handing the segment out once every initiator has
// mapped it; the memory lives until the last mapping goes.
//
// Descriptor: "shm:@refit-<pid>-<n>:slots=<S>:slot_bytes=<B>".
//
// The initiator (open_target) receives the descriptor and maps the segment
// read-write: mapped_slot gives the slot's address (pack in place), submit
// is a memcpy that completes at once. Visibility to the target is ordered by
// the kLanded frame the initiator sends on the data-plane link after
// writing.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace refit {

std::unique_ptr<Transport> make_shm_transport();

}  // namespace refit
