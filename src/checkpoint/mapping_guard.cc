#include "checkpoint/mapping_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "refit/log.h"

namespace refit {
namespace {

// One guarded mapping: [begin, end) (end rounded up to a page). Read by the
// signal handler, so only lock-free atomics.
struct Slot {
  std::atomic<std::uintptr_t> begin{0};
  std::atomic<std::uintptr_t> end{0};
  std::atomic<bool> faulted{false};
  bool used = false;  // under g_mu
};

Slot g_slots[kMaxGuardedMappings];
std::mutex g_mu;
std::once_flag g_install_once;
struct sigaction g_previous {};
std::uintptr_t g_page = 4096;

// Hands a SIGBUS that is not ours to the handler that was there before.
void forward(int sig, siginfo_t* info, void* context) {
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction != nullptr) return g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    return g_previous.sa_handler(sig);
  }
  // The default action (an ignored SIGBUS from a fault would fault forever):
  // restored, and the faulting instruction runs again and ends the process.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGBUS, &dfl, nullptr);
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const auto address = reinterpret_cast<std::uintptr_t>(info->si_addr);
  for (Slot& slot : g_slots) {
    const std::uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    const std::uintptr_t end = slot.end.load(std::memory_order_acquire);
    if (begin == 0 || address < begin || address >= end) continue;
    // Zero pages over the faulting page and everything after it in this
    // mapping: the read that faulted, and every later one, return zeros.
    const std::uintptr_t page = address & ~(g_page - 1);
    void* p = ::mmap(reinterpret_cast<void*>(page), end - page, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (p == MAP_FAILED) break;
    slot.faulted.store(true, std::memory_order_release);
    return;
  }
  forward(sig, info, context);
}

void install() {
  const long page = ::sysconf(_SC_PAGESIZE);
  if (page > 0) g_page = static_cast<std::uintptr_t>(page);
  struct sigaction action {};
  action.sa_sigaction = on_sigbus;
  action.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGBUS, &action, &g_previous);
}

}  // namespace

int MappingGuard::guard(const void* base, std::size_t size) {
  if (base == nullptr || size == 0) return -1;
  std::call_once(g_install_once, install);
  std::lock_guard<std::mutex> lock(g_mu);
  for (int i = 0; i < kMaxGuardedMappings; ++i) {
    Slot& slot = g_slots[i];
    if (slot.used) continue;
    slot.used = true;
    const auto begin = reinterpret_cast<std::uintptr_t>(base);
    slot.faulted.store(false, std::memory_order_relaxed);
    slot.end.store((begin + size + g_page - 1) & ~(g_page - 1), std::memory_order_release);
    slot.begin.store(begin, std::memory_order_release);
    return i;
  }
  static std::once_flag said;
  std::call_once(said, [] {
    log(LogLevel::kWarning, "refit checkpoint",
        "more than " + std::to_string(kMaxGuardedMappings) +
            " files mapped at once: the others are not guarded against truncation while in use (SIGBUS)");
  });
  return -1;
}

bool MappingGuard::faulted(int slot) {
  if (slot < 0 || slot >= kMaxGuardedMappings) return false;
  return g_slots[slot].faulted.load(std::memory_order_acquire);
}

void MappingGuard::release(int slot) {
  if (slot < 0 || slot >= kMaxGuardedMappings) return;
  std::lock_guard<std::mutex> lock(g_mu);
  Slot& s = g_slots[slot];
  s.begin.store(0, std::memory_order_release);
  s.end.store(0, std::memory_order_release);
  s.faulted.store(false, std::memory_order_relaxed);
  s.used = false;
}

}  // namespace refit
