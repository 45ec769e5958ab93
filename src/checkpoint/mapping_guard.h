// A guard that turns a SIGBUS in a mapped file into a recorded fault.
//
// A file mapped with mmap raises SIGBUS in whichever thread touches a page
// that is no longer backed by the file: a checkpoint shard truncated (or
// rewritten shorter) while a trainer packs from its mapping would kill the
// process with signal 7. A guarded mapping is registered here; a SIGBUS whose
// address lies inside one is answered by mapping anonymous zero pages over
// the rest of that mapping (so the faulting read, and every later one,
// returns zeros instead of faulting again) and by marking the mapping
// faulted. The owner then asks faulted() after every read of the mapping and
// fails with an error that names the file: the zeros are never used as
// weights (SafetensorsFile::check_unchanged).
//
// A SIGBUS anywhere else goes to the handler that was installed before the
// first guard (or the default action: the process dies of the signal, as
// without the guard). The handler is installed once, on the first guard.
//
// Why not read with pread instead of touching the mapping: every packer of
// the trainer (the shm and tcp packs, the pinned pack threads, the shard
// copies) reads weights through a pointer, and the GPU copy engines read the
// registered mapping itself (cudaHostRegister); a pread path would add a
// host copy to each and change every one of them. The guard keeps the
// zero-copy mapping and needs only a check after the reads.
//
// Thread safety: guard() and release() may be called from any thread;
// faulted() is a lock-free read. At most kMaxGuardedMappings mappings are
// guarded at once; beyond that guard() returns -1 (unguarded) and says why.
#pragma once

#include <cstddef>

namespace refit {

inline constexpr int kMaxGuardedMappings = 4096;

class MappingGuard {
 public:
  // Guards [base, base + size) (a whole mapping made with mmap). Returns the
  // slot to pass to faulted() and release(), or -1 when every slot is taken
  // (the mapping is then not guarded; logged once).
  static int guard(const void* base, std::size_t size);
  // Whether a SIGBUS hit the mapping of `slot` since guard(). false for -1.
  static bool faulted(int slot);
  // Stops guarding `slot` (before the mapping is unmapped). -1 is ignored.
  static void release(int slot);
};

}  // namespace refit
