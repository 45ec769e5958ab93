// nccl: a two-sided transport between one trainer rank and one engine rank
// whose memory is CUDA device memory, on one host or across hosts (whatever
// NCCL reaches: NVLink/P2P, shared memory, InfiniBand, sockets).
//
// Communicators. Each TargetMemory (one engine rank's pool, or its exposed
// weights) makes ONE ncclUniqueId when it is created and publishes it in its
// descriptor; the coordinator forwards the descriptor to the trainer rank that
// feeds the engine rank, so the id is exchanged through the coordinator, never
// on a side channel. The id forms one 2-rank communicator: engine = NCCL rank
// 0, trainer = NCCL rank 1. Why one id per target and not one per trainer:
// the engine makes its descriptor before it learns who feeds it, and every
// feeder receives the same descriptor; a (1 + feeders)-rank communicator would
// need each trainer's index, which the transport interface does not carry.
// So an nccl target takes exactly ONE initiator (capabilities().one_initiator:
// every rank refuses --trainer-ranks != --engine-ranks at setup, naming both);
// frames from a second trainer fail with kFailedPrecondition naming both.
// A feeder that takes a dropped engine's place (many engines: the trainer
// rank when engine 0 goes, a relay parent for an orphaned child) opens the
// target and calls relinked() before its first write: it pairs in a new
// communicator (below) and feeds the target from then on.
//
// Both sides create the communicator once, without blocking
// (ncclCommInitRankConfig, config.blocking = 0): the trainer in
// open_target_on (on the device it names: the trainer's weights' device, the
// device of every byte it submits; open_target takes the calling thread's
// current device), the engine in seal() (after every trainer opened the
// target; or at the first frame). The first submit / receive_data waits for
// the initialization to finish, bounded by its Deadline.
//
// Recovery. After a failed refit the runtime relinks (new data-plane Links,
// targets kept) and calls RemoteTarget::relinked(): either side's
// communicator may have been aborted, or hold a send never received, so the
// trainer aborts its own, waits for its stream and forgets its tickets. Its
// next submit makes a NEW ncclUniqueId (the bootstrap root then listens in
// the trainer's process: the engine must reach the trainer's
// NCCL_SOCKET_IFNAME address, as NCCL itself needs both ways anyway) and
// sends it in-band, first on the new Link:
//   kData, flags = 1 (new communicator), a = version, b = slot, c = 0, d = 0,
//   payload = the 128-byte id
// then starts its side (rank 1). The engine's receive_data, on that frame,
// aborts its old communicator, waits for its stream, logs "new communicator
// N" and starts its side (rank 0); the following write frame waits for the
// initialization as at setup. Every relink makes a new pair, so no state of
// the failed refit survives on either side.
//
// Data. submit() sends a kData frame WITHOUT payload on the data-plane Link
//   a = version, b = slot, c = offset in slot, d = length, payload_bytes = 0
// and then enqueues ncclSend of the bytes on the trainer's stream (in this
// order: NCCL connects the pair lazily at the first send/recv, which needs
// the engine to have posted its recv).
// The engine's receive_data (one I/O thread) checks the frame against the
// pool, posts the matching ncclRecv into slot + offset on its own stream and
// returns only once the bytes are in device memory (a CUDA event), so the
// next frame on the link (kLanded) is handled after the bytes are visible.
// poll(ticket) is true once the ncclSend's event completed: the source buffer
// may be reused. A ticket's frame and send are ordered with every other on the
// link and the communicator, so a kLanded sent after poll() returned true
// reaches the engine after its bytes.
//
// Nothing waits unbounded. Every wait loop checks, in turn: the CUDA event,
// ncclCommGetAsyncError, the Link (a peer that died or a link that was shut
// down, e.g. by an abort from the coordinator, shows as POLLRDHUP/POLLHUP on
// its socket), and the Deadline (submit's deadline for its ticket; the
// engine's receive_data gets Deadline::Never() from the receiver, which
// shuts the links down when the refit is aborted). On any failure the
// communicator is aborted (ncclCommAbort) and the error names the peer and
// the phase ("initializing the communicator", "receiving 4096 bytes into slot
// 1"). An aborted communicator stays aborted until the next relink: every
// later submit or frame fails, naming the first failure.
//
// Memory. Pools are one cudaMalloc on PoolOptions::device (host pools are
// refused); expose_memory exposes existing device memory as one slot (direct
// mode: the trainer submits each tensor at its offset in the engine's weight
// arena). mapped_slot() is always nullptr: the trainer packs into its own
// device buffer and submits it.
//
// Environment. NCCL's own variables apply (NCCL_SOCKET_IFNAME, NCCL_IB_HCA,
// NCCL_DEBUG, ...). Two ranks on ONE GPU of one host are refused by NCCL
// ("Duplicate GPU detected"); giving each process its own NCCL_HOSTID (NCCL
// hashes the host from it) with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
// NCCL_NET=Socket makes them look like two hosts (the one-GPU test does this).
//
// Built only when CUDA and NCCL are found (REFIT_HAVE_NCCL); registered in
// registry.cc only then.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace refit {

// Defined only in builds with NCCL (REFIT_HAVE_NCCL).
std::unique_ptr<Transport> make_nccl_transport();

}  // namespace refit
