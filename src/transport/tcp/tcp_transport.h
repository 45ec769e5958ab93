// tcp: a two-sided transport that works between any two hosts. The bytes of a
// submit travel over the data-plane Link itself as one kData frame
// {a = version, b = slot, c = offset in slot, payload = the bytes}; the engine
// side's I/O thread hands each kData frame to TargetMemory::receive_data,
// which validates slot/offset/length against the pool and reads the payload
// straight into the slot.
//
// The pool is page-aligned anonymous host memory, touched at setup.
// Descriptor: "tcp:slots=<S>:slot_bytes=<B>". Nothing has a name, so seal()
// has nothing to do.
//
// Completion: submit returns once the frame was written to the socket; poll
// is then true. Because frames on one link are ordered, a kLanded frame sent
// after it arrives after the bytes.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace refit {

std::unique_ptr<Transport> make_tcp_transport();

}  // namespace refit
