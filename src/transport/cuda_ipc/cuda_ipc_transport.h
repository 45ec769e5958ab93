// cuda_ipc: a one-sided transport between processes of one host whose target
// memory is CUDA device memory, on the same GPU or a peer GPU.
//
// Engine side. create_target makes ONE cudaMalloc on PoolOptions::device that
// holds every slot and exports it ONCE (cudaIpcGetMemHandle); expose_memory
// exports the cudaMalloc allocation that contains an existing range (direct
// mode: the engine's own parameter memory) and records where the range starts
// inside it. Pools in host memory are refused. The pool is freed (its device
// current) in the destructor; nothing is named in the file system, so seal()
// has nothing to do. A one-sided target never takes a kData frame.
//
// Descriptor (see cuda_ipc_descriptor.h):
//   "cuda_ipc:dev=<pci bus id>:slots=<S>:slot_bytes=<B>:offset=<O>:handle=<hex>"
//
// Initiator side. open_target maps the allocation ONCE
// (cudaIpcOpenMemHandle with cudaIpcMemLazyEnablePeerAccess) in the context of
// the local device whose PCI bus id matches `dev`, or, when that GPU is not
// visible to this process (CUDA_VISIBLE_DEVICES), of the calling thread's
// current device, reaching the target as a peer. The mapping is closed in the
// destructor, after every copy queued on it has finished. A handle exported by
// this same process cannot be opened (a CUDA rule): open_target says so with
// kFailedPrecondition.
//
// mapped_slot(i) is the mapped DEVICE address of slot i: write it with CUDA
// (a kernel or cudaMemcpy) and finish that work before sending kLanded.
// submit is a cudaMemcpyAsync (cudaMemcpyDefault: the source may be device
// memory of any device or host memory) on the target's internal stream,
// followed by an event; poll is cudaEventQuery of that event (true: the bytes
// are in the target's memory, so a kLanded frame sent afterwards orders them
// for the engine, which reads them on its own stream). cancel is best effort
// and does nothing: a queued copy cannot be withdrawn; poll it, or destroy
// the RemoteTarget, which waits for it.
// REQUIRES (submit): the source bytes are ready when submit is called (any
// stream that produced them has been synchronized); the transport does not
// know the producer's stream.
//
// Built only when REFIT_HAVE_CUDA; registered in registry.cc only then.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace refit {

// Defined only in builds with CUDA (REFIT_HAVE_CUDA).
std::unique_ptr<Transport> make_cuda_ipc_transport();

}  // namespace refit
