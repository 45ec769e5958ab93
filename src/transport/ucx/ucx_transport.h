// ucx: refit's transport between hosts on UCX (UCP, the communication engine
// of NIXL and most RDMA refits): one-sided puts into the engine's registered
// memory. Built when pkg-config finds UCX (libucx-dev); registered in
// registry.cc only then.
//
// One UCP context and one worker per Transport object (a rank process makes
// one), created on first use with UCS_THREAD_MODE_MULTI (the worker is driven
// by the target's progress thread and by the initiator's poll, possibly in
// one process) and shared, through shared_ptr, by every target and remote the
// transport made; it lives until the last of them is gone.
//
// Engine side. create_target allocates the pool (page-aligned anonymous
// memory, every page touched at setup) and registers it ONCE (ucp_mem_map);
// expose_memory registers existing memory ONCE (direct mode: the engine's
// weights). The descriptor (ucx_descriptor.h) carries the worker's address,
// the packed rkey and the slot layout. While a target lives, a progress
// thread drives the worker: UCX's tcp transport (and its software RMA) only
// moves a put's bytes into the target when the target's worker progresses, and
// refit's engine never calls into the transport during a refit. The thread
// spins briefly after activity, then sleeps on the worker's event fd
// (ucp_worker_arm), so an idle engine costs nothing. It is stopped (and the
// memory unregistered) in the target's destructor. A target never takes a
// kData frame; nothing has a name, so seal() has nothing to do.
//
// Initiator side. open_target creates ONE endpoint to the engine's worker
// with peer error handling (UCP_ERR_HANDLING_MODE_PEER) and an error handler,
// unpacks the rkey once, and waits (at most UcxOptions::connect_timeout) until the
// endpoint is wired up, so an unreachable engine is a setup error. Where the
// selected UCX transports cannot detect peer failure (shared memory: UCX_TLS=sm
// or posix), the endpoint falls back to no error handling, once, with a warning
// through refit::log; peer failure is then seen on the data-plane Link only.
// mapped_slot is nullptr (two-sided for the packing code: the trainer packs
// into its own buffer and submits). The remote holds a progress lease: the
// worker's progress thread moves its writes while the caller does something
// else (the trainer packs the next bucket); submit wakes it, poll only looks
// (and naps 100 us when the write is still on its way). How submit moves the bytes depends on
// what UCX reaches the engine with (UcxOptions::writes):
//   native RMA (shared memory, InfiniBand, ...): ucp_put_nbx into the slot,
//     then ucp_ep_flush_nbx; poll progresses the worker and is true once both
//     completed: the flush makes the bytes visible in the target's memory
//     (remote completion).
//   no native RMA (tcp): active-message writes (ucx_am_writes.h): eager
//     ucp_am_send_nbx chunks that the engine's progress thread copies into
//     the slot, acknowledging the last one; poll is true once the ack came
//     back. UCX itself would emulate the put the same way, but 1.13 aborts
//     the engine process when a trainer dies mid-put (see ucx_am_writes.h).
// Either way the bytes are in the target's memory when poll returns true, so
// the kLanded frame the trainer sends next on the Link never overtakes them.
// Once the endpoint's error handler fired (peer process died, connection
// reset), every submit and poll fails with kUnavailable naming the peer (the
// Link's peer name: "engine rank 1 at 10.0.0.3:41234") and the UCX status.
// cancel does nothing: a write cannot be withdrawn; destroying the remote
// closes the endpoint (forcibly, after a bounded flush), after which UCX
// reads no source buffer.
//
// Thread safety: a target may be used from any thread (its progress thread
// is internal); a remote from one thread at a time (the interface's rule).
//
// Configuration: UCX's own environment variables (UCX_TLS, UCX_NET_DEVICES,
// UCX_TCP_*, ...) are read by UCX itself (ucp_config_read) and respected as
// they are; UcxOptions set programmatically override them for this transport.
// Defaults work: all transports UCX finds.
//
// Device memory (a device pool, or exposed device weights): registered with
// UCX as CUDA memory when this UCX build supports it (ucp_context_query
// memory_types; descriptor mem=cuda; untested here); otherwise not registered
// at all (mem=staged, no rkey): only active-message writes reach it, and the
// engine's progress thread copies each chunk through pinned buffers into the
// device (ucx_device_stager.h), acknowledging a write once its copies
// finished. Said once per process through refit::log. Active-message writes into
// device memory always go through the stager. capabilities(): device_memory
// when UCX supports CUDA or refit was built with CUDA; device_memory_staged
// when only the latter (the runtime then stages the trainer's device weights
// through pinned host buffers too, and reports "host-staged").
// capabilities().direct: expose_memory registers existing memory as one
// slot, and the trainer submits each packed run at its offset in it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "transport/transport.h"

namespace refit {

// How long open_target waits, by default, for the endpoint to a target's
// worker to be wired up before failing with kUnavailable.
inline constexpr std::chrono::seconds kUcxConnectTimeout{30};

struct UcxOptions {
  // UCX_TLS for this transport's context, e.g. "tcp", "sm", "rc,self".
  // Default "": UCX_TLS from the environment, else all transports.
  std::string tls;
  // UCX_NET_DEVICES, e.g. "eth0", "mlx5_0:1". Default "": the environment's,
  // else all devices.
  std::string net_devices;
  // How submit moves bytes: kAuto takes ucp_put_nbx where UCX reaches the
  // peer with native remote memory access (shared memory, InfiniBand) and
  // active-message writes where it would emulate puts in software (tcp);
  // see ucx_am_writes.h for why. The others force one (tests).
  enum class Writes { kAuto, kPut, kActiveMessage };
  Writes writes = Writes::kAuto;
  // How long open_target waits for the endpoint to be wired up.
  std::chrono::milliseconds connect_timeout = kUcxConnectTimeout;
};

// Defined only in builds with UCX (REFIT_HAVE_UCX). The registry's "ucx" is
// make_ucx_transport(): default options.
std::unique_ptr<Transport> make_ucx_transport();
std::unique_ptr<Transport> make_ucx_transport_with(const UcxOptions& options);

}  // namespace refit
