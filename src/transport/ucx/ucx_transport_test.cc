// ucx specifics beyond the conformance suite (which runs over ucx with
// UCX_TLS=tcp and =sm): a killed peer, an unreachable one, direct mode into
// exposed memory, capabilities and options. Engine and trainer sides run in
// separate processes (fork) so that puts really cross a process boundary.
//
// Every test skips with the reason when refit was built without UCX. Each
// says which broken implementation it catches ("Catches: ...").
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device.h"
#include "net/link.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_transport.h"  // declarations only: defined where REFIT_HAVE_UCX
#include "testing/forked_child.h"
#include "testing/scoped_env.h"
#include "testing/ucx_test_util.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

#define EXPECT_HAS(haystack, needle)                               \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "expected \"" << (needle) << "\" in: " << (haystack)

using testing::ForkedChild;

using testing::ReadAll;
using testing::ReceiveString;
using testing::SendString;
using testing::WriteAll;

// Stops `pid` (SIGSTOP) and returns once every thread of it is stopped:
// kill() returns before the signal takes effect, and a thread of a busy
// process may still run (and, say, complete a write) for a moment after.
bool StopAndWait(pid_t pid) {
  if (::kill(pid, SIGSTOP) != 0) return false;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  while (std::chrono::steady_clock::now() < give_up) {
    bool all_stopped = true;
    for (const auto& task : std::filesystem::directory_iterator(tasks)) {
      std::ifstream stat(task.path() / "stat");
      std::string line;
      std::getline(stat, line);
      // "pid (comm) S ...": the state is the first field after the last ')'.
      const std::size_t close = line.rfind(')');
      if (close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'T') all_stopped = false;
    }
    if (all_stopped) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// A Link whose only job is to name the peer ("engine rank 3 at ...").
struct NamingLink {
  std::unique_ptr<Link> link;
  int other = -1;
  explicit NamingLink(const std::string& peer) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) std::abort();
    link = std::make_unique<Link>(sv[0], peer);
    other = sv[1];
  }
  ~NamingLink() { ::close(other); }
};

// Child body: hosts a ucx pool (the engine side), sends its descriptor, then
// waits for a byte from the parent (or its death) before it exits.
int HostPool(int to_parent, int from_parent, int slots, std::uint64_t slot_bytes) {
  auto t = make_transport("ucx");
  if (!t.ok()) return 2;
  PoolOptions o;
  o.slots = slots;
  o.slot_bytes = slot_bytes;
  o.owner = "engine rank 3";
  auto target = (*t)->create_target(o);
  if (!target.ok()) {
    std::fprintf(stderr, "child: %s\n", target.status().ToString().c_str());
    return 3;
  }
  if (!SendString(to_parent, (*target)->descriptor())) return 4;
  char byte = 0;
  (void)ReadAll(from_parent, &byte, 1);
  return 0;
}

// Submits and polls until done, an error, or `deadline`.
Status WriteAndWait(RemoteTarget& remote, int slot, std::uint64_t offset, std::span<const std::byte> bytes,
                    Deadline deadline) {
  ASSIGN_OR_RETURN(Ticket ticket, remote.submit(slot, offset, bytes, 1, deadline));
  for (;;) {
    ASSIGN_OR_RETURN(bool done, remote.poll(ticket));
    if (done) return Status::Ok();
    if (deadline.expired()) return DeadlineExceeded("write never completed");
  }
}

// Child body: hosts a ucx pool of one slot; on each byte from the parent,
// answers 1 when the slot's first `bytes` bytes all equal `value`, else 0.
// Exits when the parent's pipe closes.
int HostPoolAnsweringLanded(int to_parent, int from_parent, std::uint64_t bytes, std::byte value) {
  auto t = make_transport("ucx");
  if (!t.ok()) return 2;
  PoolOptions o;
  o.slots = 2;
  o.slot_bytes = bytes;
  o.owner = "engine rank 3";
  auto target = (*t)->create_target(o);
  if (!target.ok()) return 3;
  if (!SendString(to_parent, (*target)->descriptor())) return 4;
  char byte = 0;
  while (ReadAll(from_parent, &byte, 1)) {
    const std::byte* p = (*target)->slot(0);
    char landed = 1;
    for (std::uint64_t i = 0; i < bytes; ++i) {
      if (p[i] != value) {
        landed = 0;
        break;
      }
    }
    if (!WriteAll(to_parent, &landed, 1)) return 5;
  }
  return 0;
}

// The trainer packs bucket j+1 while bucket j's write is in flight, calling
// nothing of the transport meanwhile: the write must move on its own (UCX's
// tcp sends only what the socket takes at once, the rest when the
// initiator's worker progresses).
// Catches: an initiator without its own progress (no ProgressLease in
// UcxRemote): the bytes wait in UCX's queue until the next poll, and the
// pack and the write do not overlap.
TEST(UcxTransport, WritesMoveWhileTheInitiatorDoesNotPoll) {
  REFIT_SKIP_WITHOUT_UCX();
  testing::ScopedEnv tls("UCX_TLS", "tcp");
  constexpr std::uint64_t kBytes = 48 << 20;  // far more than the socket buffers hold
  ForkedChild engine([&](int up, int down) { return HostPoolAnsweringLanded(up, down, kBytes, std::byte{0x5a}); });
  const std::string descriptor = ReceiveString(engine.from_child());
  ASSERT_EQ(descriptor.rfind("ucx:", 0), 0u);
  auto t = make_transport("ucx");
  ASSERT_TRUE(t.ok());
  auto remote = (*t)->open_target(descriptor, nullptr);
  ASSERT_OK(remote);
  std::vector<std::byte> bytes(kBytes, std::byte{0x5a});
  auto ticket = (*remote)->submit(0, 0, bytes, 1, Deadline::After(30s));
  ASSERT_OK(ticket);
  // No poll: ask the engine until every byte is there (or 20 s passed).
  bool landed = false;
  for (auto until = Clock::now() + 20s; !landed && Clock::now() < until;) {
    std::this_thread::sleep_for(100ms);
    char ask = 1, answer = 0;
    ASSERT_TRUE(WriteAll(engine.to_child(), &ask, 1) && ReadAll(engine.from_child(), &answer, 1));
    landed = answer == 1;
  }
  EXPECT_TRUE(landed) << "a write did not reach the engine while the initiator did not poll";
  EXPECT_TRUE(WriteAndWait(**remote, 1, 0, std::span<const std::byte>(bytes.data(), 16), Deadline::After(20s)).ok());
  auto done = (*remote)->poll(*ticket);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
}

// Catches: errors that do not name the peer, a code other than kUnavailable
// (the runtime reports it as a lost peer), and a remote that goes on taking
// writes after its peer died. (Peer error handling is not what makes this
// pass over tcp: the reset connection fails the write in either mode; it
// matters for a peer lost silently, which this does not test.)
TEST(UcxTransport, KilledPeerFailsTheNextWriteWithUnavailableNamingThePeer) {
  REFIT_SKIP_WITHOUT_UCX();
  testing::ScopedEnv tls("UCX_TLS", "tcp");
  constexpr std::uint64_t kSlotBytes = 1 << 20;
  ForkedChild engine([&](int up, int down) { return HostPool(up, down, 2, kSlotBytes); });
  const std::string descriptor = ReceiveString(engine.from_child());
  ASSERT_EQ(descriptor.rfind("ucx:", 0), 0u) << "the engine process sent no descriptor";

  auto t = make_transport("ucx");
  ASSERT_TRUE(t.ok());
  NamingLink link("engine rank 3 at 10.1.2.3:4567");
  auto remote = (*t)->open_target(descriptor, link.link.get());
  ASSERT_OK(remote);
  std::vector<std::byte> bytes(kSlotBytes, std::byte{0x42});
  Status first = WriteAndWait(**remote, 0, 0, bytes, Deadline::After(20s));
  ASSERT_OK(first);

  engine.Kill();
  const auto killed = Clock::now();
  Status failed;
  const Deadline deadline = Deadline::After(20s);
  for (int slot = 0; failed.ok() && !deadline.expired(); slot ^= 1) {
    failed = WriteAndWait(**remote, slot, 0, bytes, deadline);
  }
  ASSERT_FALSE(failed.ok()) << "writes into a killed engine kept succeeding for 20 s";
  EXPECT_EQ(failed.code(), StatusCode::kUnavailable) << failed.ToString();
  EXPECT_HAS(failed.message(), "engine rank 3 at 10.1.2.3:4567");
  EXPECT_HAS(failed.message(), "UCX_TLS=tcp");
  EXPECT_LT(Clock::now() - killed, 10s) << "took too long to notice: " << failed.ToString();
  // Once failed, it stays failed (the next write does not pretend success).
  auto again = (*remote)->submit(0, 0, bytes, 2, Deadline::After(1s));
  EXPECT_FALSE(again.ok());
}

// A trainer killed in the middle of its writes must not take the engine
// down: the engine's worker still owes it acknowledgements, whose failure
// UCX may treat as fatal. The engine process must outlive it and exit
// cleanly when told to.
// Catches: a target whose worker aborts the engine process when a peer dies
// mid-write (UCX's "Fatal: unexpected error" on an internal request).
TEST(UcxTransport, TrainerKilledMidWriteLeavesTheEngineRunning) {
  REFIT_SKIP_WITHOUT_UCX();
  testing::ScopedEnv tls("UCX_TLS", "tcp");
  constexpr std::uint64_t kSlotBytes = 8 << 20;
  ForkedChild engine([&](int up, int down) { return HostPool(up, down, 2, kSlotBytes); });
  const std::string descriptor = ReceiveString(engine.from_child());
  ASSERT_EQ(descriptor.rfind("ucx:", 0), 0u);
  ForkedChild trainer([&](int up, int) {
    auto ct = make_transport("ucx");
    if (!ct.ok()) return 2;
    auto remote = (*ct)->open_target(descriptor, nullptr);
    if (!remote.ok()) return 3;
    std::vector<std::byte> src(kSlotBytes, std::byte{7});
    for (int i = 0;; ++i) {
      auto ticket = (*remote)->submit(i % 2, 0, src, 1, Deadline::After(60s));
      if (!ticket.ok()) return 4;
      if (i == 4) {
        char started = 1;
        if (!WriteAll(up, &started, 1)) return 5;
      }
      for (int k = 0; k < 8; ++k) (void)(*remote)->poll(*ticket);  // leave most writes in flight
    }
  });
  char started = 0;
  ASSERT_TRUE(ReadAll(trainer.from_child(), &started, 1)) << "the trainer process failed";
  trainer.Kill();
  std::this_thread::sleep_for(3s);  // the engine's worker notices the dead peer
  char bye = 0;
  ASSERT_TRUE(WriteAll(engine.to_child(), &bye, 1)) << "the engine process died with the trainer";
  EXPECT_EQ(engine.Wait(), 0) << "the engine process did not exit cleanly after its trainer was killed";
}

// Catches: an error that does not name the peer or is not kUnavailable
// (here UCX's connect is refused at once, inside ucp_ep_create).
TEST(UcxTransport, UnreachableEngineFailsAtOpenNamingIt) {
  REFIT_SKIP_WITHOUT_UCX();
  testing::ScopedEnv tls("UCX_TLS", "tcp");
  ForkedChild engine([&](int up, int down) {
    ::close(down);  // exit at once after sending the descriptor
    return HostPool(up, -1, 2, 4096);
  });
  const std::string descriptor = ReceiveString(engine.from_child());
  ASSERT_EQ(descriptor.rfind("ucx:", 0), 0u);
  ASSERT_EQ(engine.Wait(), 0);  // its worker is gone
  auto t = make_transport("ucx");
  ASSERT_TRUE(t.ok());
  NamingLink link("engine rank 3 at 10.1.2.3:4567");
  const auto start = Clock::now();
  auto remote = (*t)->open_target(descriptor, link.link.get());
  ASSERT_FALSE(remote.ok()) << "opened a target whose process has exited";
  EXPECT_EQ(remote.status().code(), StatusCode::kUnavailable) << remote.status().ToString();
  EXPECT_HAS(remote.status().message(), "engine rank 3 at 10.1.2.3:4567");
  EXPECT_LT(Clock::now() - start, kUcxConnectTimeout + 5s);
}

#if REFIT_HAVE_UCX
// An engine that accepts the connection but never answers (stopped): open
// waits for the endpoint's wire-up, at most the connect timeout, and fails
// then, naming the engine, so the job fails at setup, not in its first refit.
// Catches: an open_target that returns before the endpoint is wired up.
TEST(UcxTransport, SilentEngineFailsAtOpenAfterTheConnectTimeout) {
  testing::ScopedEnv tls("UCX_TLS", "tcp");
  ForkedChild engine([&](int up, int down) { return HostPool(up, down, 2, 4096); });
  const std::string descriptor = ReceiveString(engine.from_child());
  ASSERT_EQ(descriptor.rfind("ucx:", 0), 0u);
  ASSERT_TRUE(StopAndWait(engine.pid())) << "the engine process did not stop";
  UcxOptions options;
  options.connect_timeout = 1s;
  NamingLink link("engine rank 3 at 10.1.2.3:4567");
  const auto start = Clock::now();
  auto remote = make_ucx_transport_with(options)->open_target(descriptor, link.link.get());
  const auto took = Clock::now() - start;
  ::kill(engine.pid(), SIGCONT);
  ASSERT_FALSE(remote.ok()) << "opened a target whose engine never answered";
  EXPECT_EQ(remote.status().code(), StatusCode::kUnavailable) << remote.status().ToString();
  EXPECT_HAS(remote.status().message(), "engine rank 3 at 10.1.2.3:4567");
  EXPECT_HAS(remote.status().message(), "within 1000 ms");
  EXPECT_GE(took, 1s);
  EXPECT_LT(took, 10s);
}
#endif

// Direct mode: writes into EXISTING memory registered by expose_memory land
// at the right addresses, bit-exact, and nothing outside the exposed range
// is touched. Over tcp and over shared memory.
// Catches: a descriptor addr that is not the exposed base (writes land
// elsewhere or fail), a registration of the wrong length (the last bytes
// refused), and an offset computed per slot instead of from the base.
class UcxExpose : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxExpose, WritesFromAnotherProcessLandInTheExposedRange) {
  REFIT_SKIP_WITHOUT_UCX();
  testing::ScopedEnv tls("UCX_TLS", GetParam());
  constexpr std::uint64_t kBytes = (1 << 20) + 13, kGuard = 4096;
  struct Write {
    std::uint64_t offset, bytes;
  };
  const std::vector<Write> writes = {{0, 1000}, {kBytes - 77, 77}, {4097, 300000}, {777777, 3}};
  auto byte_of = [](std::uint64_t pos) { return static_cast<std::byte>((pos * 131 + 7) % 251); };
  // The trainer is forked before this process initializes UCX (a child
  // forked after it inherits UCX's global state without its threads, and
  // under ASan its writes over tcp then never completed); it gets the
  // descriptor through the pipe.
  ForkedChild trainer([&](int up, int down) {
    const std::string descriptor = ReceiveString(down);
    if (descriptor.empty()) return 8;
    auto ct = make_transport("ucx");
    if (!ct.ok()) return 2;
    auto remote = (*ct)->open_target(descriptor, nullptr);
    if (!remote.ok()) {
      std::fprintf(stderr, "child: %s\n", remote.status().ToString().c_str());
      return 3;
    }
    if ((*remote)->mapped_slot(0) != nullptr) return 4;  // ucx never maps
    for (const Write& w : writes) {
      std::vector<std::byte> src(w.bytes);
      for (std::uint64_t i = 0; i < w.bytes; ++i) src[i] = byte_of(w.offset + i);
      Status s = WriteAndWait(**remote, 0, w.offset, src, Deadline::After(20s));
      if (!s.ok()) {
        std::fprintf(stderr, "child: %s\n", s.ToString().c_str());
        return 5;
      }
    }
    // One past the end is refused.
    std::vector<std::byte> one(1);
    if ((*remote)->submit(0, kBytes, one, 1, Deadline::After(1s)).ok()) return 6;
    char done = 1;
    return WriteAll(up, &done, 1) ? 0 : 7;
  });

  std::vector<std::byte> arena(kBytes + 2 * kGuard, std::byte{0x5A});
  std::byte* base = arena.data() + kGuard;
  auto t = make_transport("ucx");
  ASSERT_TRUE(t.ok());
  auto exposed = (*t)->expose_memory(base, kBytes, MemoryKind::kHost, -1);
  ASSERT_OK(exposed);
  EXPECT_EQ((*exposed)->slots(), 1);
  EXPECT_EQ((*exposed)->slot_bytes(), kBytes);
  EXPECT_EQ((*exposed)->slot(0), base);
  ASSERT_TRUE(SendString(trainer.to_child(), (*exposed)->descriptor())) << "the trainer process died";

  char done = 0;
  ASSERT_TRUE(ReadAll(trainer.from_child(), &done, 1)) << "the trainer process failed (see its stderr)";
  // poll returned true in the child: the bytes are here now.
  std::vector<std::byte> want(kBytes, std::byte{0x5A});
  for (const Write& w : writes) {
    for (std::uint64_t i = 0; i < w.bytes; ++i) want[w.offset + i] = byte_of(w.offset + i);
  }
  for (std::uint64_t i = 0; i < kBytes; ++i) {
    ASSERT_EQ(base[i], want[i]) << "exposed byte " << i << " differs";
  }
  for (std::uint64_t i = 0; i < kGuard; ++i) {
    ASSERT_EQ(arena[i], std::byte{0x5A}) << "guard byte before the range was written";
    ASSERT_EQ(arena[kGuard + kBytes + i], std::byte{0x5A}) << "guard byte after the range was written";
  }
  EXPECT_EQ(trainer.Wait(), 0);
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxExpose, ::testing::Values("tcp", "sm"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// The completion contract: once poll returned true, every byte is in the
// target's memory, with nothing more for the target to do. A 32 MiB write
// over tcp is still partly in socket buffers (and in the target's receive
// path) when UCX reports the sends complete locally; the engine checks the
// slot the moment the trainer says so, as it does on kLanded. Both ways of
// writing: the default over tcp (active-message writes) and puts forced
// (UCX's software put).
// Catches: poll true on local completion: active-message writes without
// waiting for the engine's ack, puts without the endpoint flush.
class UcxCompletion : public ::testing::TestWithParam<bool> {};

TEST_P(UcxCompletion, LargeWriteIsInTheTargetsMemoryWhenPollReturnsTrue) {
  REFIT_SKIP_WITHOUT_UCX();
#if REFIT_HAVE_UCX
  const bool force_put = GetParam();
  testing::ScopedEnv tls("UCX_TLS", "tcp");
  constexpr std::uint64_t kSlotBytes = 32 << 20;
  constexpr int kRounds = 3;
  // The trainer is forked before this process starts UCX (the target's
  // worker): a child forked after inherits UCX's state without its threads.
  ForkedChild trainer([&](int up, int down) {
    UcxOptions options;
    if (force_put) options.writes = UcxOptions::Writes::kPut;
    const std::string descriptor = ReceiveString(down);
    if (descriptor.empty()) return 2;
    auto remote = make_ucx_transport_with(options)->open_target(descriptor, nullptr);
    if (!remote.ok()) return 3;
    for (int round = 1; round <= kRounds; ++round) {
      std::vector<std::byte> src(kSlotBytes, static_cast<std::byte>(round));
      if (!WriteAndWait(**remote, 0, 0, src, Deadline::After(60s)).ok()) return 4;
      char r = static_cast<char>(round);
      if (!WriteAll(up, &r, 1) || !ReadAll(down, &r, 1)) return 5;  // "landed", then wait for the check
    }
    return 0;
  });
  auto t = make_transport("ucx");
  ASSERT_TRUE(t.ok());
  PoolOptions o;
  o.slots = 1;
  o.slot_bytes = kSlotBytes;
  auto target = (*t)->create_target(o);
  ASSERT_OK(target);
  std::memset((*target)->slot(0), 0, kSlotBytes);
  ASSERT_TRUE(SendString(trainer.to_child(), (*target)->descriptor())) << "the trainer process died";
  for (int round = 1; round <= kRounds; ++round) {
    char r = 0;
    ASSERT_TRUE(ReadAll(trainer.from_child(), &r, 1)) << "the trainer process failed";
    const std::byte* slot = (*target)->slot(0);
    // Last bytes first: they are the ones still in flight without a flush.
    for (std::uint64_t i = kSlotBytes; i-- > 0;) {
      ASSERT_EQ(slot[i], static_cast<std::byte>(round)) << "round " << round << ": byte " << i << " not there yet";
    }
    ASSERT_TRUE(WriteAll(trainer.to_child(), &r, 1));
  }
  EXPECT_EQ(trainer.Wait(), 0);
#endif
}

INSTANTIATE_TEST_SUITE_P(Writes, UcxCompletion, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("forced_put") : std::string("default");
                         });

// A cancelled write may still land: the next submit waits for it, so a
// write of a failed refit never lands after (and over) one of the next.
// With the engine stopped (SIGSTOP), the cancelled write cannot finish, so
// the next submit must give up at its deadline, saying why.
// Catches: a cancel that forgets the write (the next submit goes ahead while
// the old bytes are still on their way to the same slot).
TEST(UcxTransport, SubmitWaitsForACancelledWrite) {
  REFIT_SKIP_WITHOUT_UCX();
  testing::ScopedEnv tls("UCX_TLS", "tcp");
  constexpr std::uint64_t kSlotBytes = 8 << 20;
  ForkedChild engine([&](int up, int down) { return HostPool(up, down, 2, kSlotBytes); });
  const std::string descriptor = ReceiveString(engine.from_child());
  ASSERT_EQ(descriptor.rfind("ucx:", 0), 0u);
  auto t = make_transport("ucx");
  ASSERT_TRUE(t.ok());
  NamingLink link("engine rank 3 at 10.1.2.3:4567");
  auto remote = (*t)->open_target(descriptor, link.link.get());
  ASSERT_OK(remote);
  std::vector<std::byte> bytes(kSlotBytes, std::byte{9});
  ASSERT_TRUE(WriteAndWait(**remote, 0, 0, bytes, Deadline::After(20s)).ok());
  // Stopped for sure before the write starts (under ASan on a loaded machine
  // the engine once took the whole 8 MiB before SIGSTOP took effect).
  ASSERT_TRUE(StopAndWait(engine.pid())) << "the engine process did not stop";
  auto stuck = (*remote)->submit(0, 0, bytes, 2, Deadline::After(1s));
  ASSERT_OK(stuck);
  auto done = (*remote)->poll(*stuck);
  ASSERT_TRUE(done.ok());
  ASSERT_FALSE(*done) << "8 MiB into a stopped engine cannot be complete";
  (*remote)->cancel(*stuck);
  auto next = (*remote)->submit(1, 0, std::span<const std::byte>(bytes.data(), 16), 3, Deadline::After(300ms));
  ::kill(engine.pid(), SIGCONT);
  ASSERT_FALSE(next.ok()) << "a submit went ahead of a cancelled write still in flight";
  EXPECT_EQ(next.status().code(), StatusCode::kDeadlineExceeded) << next.status().ToString();
  EXPECT_HAS(next.status().message(), "cancelled write");
  EXPECT_HAS(next.status().message(), "engine rank 3 at 10.1.2.3:4567");
  // Once the engine runs again, the cancelled write finishes and writes go on.
  Status later = WriteAndWait(**remote, 1, 0, std::span<const std::byte>(bytes.data(), 16), Deadline::After(20s));
  EXPECT_OK(later);
}

// The engine writes only into memory it registered, whatever a trainer
// sends: a descriptor whose addr points past the pool (a bug, or a trainer
// of another job) gets the write refused, reported to the trainer, and the
// engine keeps running.
// Catches: an active-message write handler that copies to any address it
// is given (the engine would crash or corrupt memory outside its pool).
TEST(UcxTransport, WriteOutsideTheRegisteredMemoryIsRefusedByTheEngine) {
  REFIT_SKIP_WITHOUT_UCX();
  testing::ScopedEnv tls("UCX_TLS", "tcp");
  constexpr std::uint64_t kSlotBytes = 1 << 20;
  ForkedChild engine([&](int up, int down) { return HostPool(up, down, 2, kSlotBytes); });
  std::string descriptor = ReceiveString(engine.from_child());
  ASSERT_EQ(descriptor.rfind("ucx:", 0), 0u);
  // addr=A -> addr=A + 2 slots: the whole pool shifted past its end.
  const auto at = descriptor.find(":addr=") + 6, end = descriptor.find(':', at);
  const std::uint64_t addr = std::stoull(descriptor.substr(at, end - at));
  descriptor = descriptor.substr(0, at) + std::to_string(addr + 2 * kSlotBytes) + descriptor.substr(end);
  auto t = make_transport("ucx");
  ASSERT_TRUE(t.ok());
  NamingLink link("engine rank 3 at 10.1.2.3:4567");
  auto remote = (*t)->open_target(descriptor, link.link.get());
  ASSERT_OK(remote);
  std::vector<std::byte> bytes(4096, std::byte{0x77});
  Status s = WriteAndWait(**remote, 1, 0, bytes, Deadline::After(20s));
  ASSERT_FALSE(s.ok()) << "the engine took a write outside its pool";
  EXPECT_HAS(s.message(), "refused");
  EXPECT_HAS(s.message(), "engine rank 3 at 10.1.2.3:4567");
  char bye = 0;
  ASSERT_TRUE(WriteAll(engine.to_child(), &bye, 1)) << "the engine process died";
  EXPECT_EQ(engine.Wait(), 0);
}

// Catches: capabilities that send the runtime down the wrong path: a
// mapped_slot the trainer would pack into (one_sided), direct mode not
// offered although the trainer submits direct writes per run, device memory
// claimed without a way to reach it (a build without CUDA), or staging not
// said where this UCX cannot register CUDA memory (Debian's).
TEST(UcxTransport, CapabilitiesMatchWhatItDoes) {
  REFIT_SKIP_WITHOUT_UCX();
  auto t = make_transport("ucx");
  ASSERT_TRUE(t.ok());
  const TransportCapabilities c = (*t)->capabilities();
  EXPECT_FALSE(c.one_sided);
  EXPECT_TRUE(c.remote_write);
  EXPECT_TRUE(c.cross_host);
  EXPECT_TRUE(c.host_memory);
  EXPECT_TRUE(c.direct);
  if (REFIT_HAVE_CUDA) {
    EXPECT_TRUE(c.device_memory);  // staged through pinned memory if nothing else
  } else {
    EXPECT_FALSE(c.device_memory_staged);
  }
  if (c.device_memory_staged) {
    EXPECT_TRUE(c.device_memory);
  }
  PoolOptions o;
  o.slots = 2;
  o.slot_bytes = 4096;
  o.owner = "engine rank 5";
  o.memory = MemoryKind::kCuda;
  o.device = 0;
  auto cuda = (*t)->create_target(o);
  if (!cuda_device_count().ok() || *cuda_device_count() == 0) {
    // No device here: the pool cannot exist, and the error says whose it is.
    ASSERT_FALSE(cuda.ok());
    EXPECT_HAS(cuda.status().message(), "engine rank 5");
  } else {
    ASSERT_OK(cuda);
    const std::string d = (*cuda)->descriptor();
    EXPECT_HAS(d, c.device_memory_staged ? ":mem=staged:" : ":mem=cuda:");
    EXPECT_EQ((*cuda)->memory(), MemoryKind::kCuda);
  }
}

#if REFIT_HAVE_UCX
// Catches: UcxOptions ignored (the environment's UCX_TLS used instead), and
// the environment ignored when no option is set.
TEST(UcxTransport, OptionsOverrideTheEnvironmentWhichIsOtherwiseRespected) {
  PoolOptions o;
  o.slots = 2;
  o.slot_bytes = 4096;
  {
    testing::ScopedEnv tls("UCX_TLS", "tcp");
    UcxOptions options;
    options.tls = "no_such_transport";
    auto target = make_ucx_transport_with(options)->create_target(o);
    ASSERT_FALSE(target.ok()) << "UCX_TLS=no_such_transport from the options was not applied";
    EXPECT_HAS(target.status().message(), "UCX_TLS=no_such_transport");
    auto from_env = make_ucx_transport()->create_target(o);
    EXPECT_OK(from_env);
  }
  {
    testing::ScopedEnv tls("UCX_TLS", "no_such_transport");
    auto target = make_ucx_transport()->create_target(o);
    ASSERT_FALSE(target.ok()) << "UCX_TLS=no_such_transport from the environment was not respected";
    EXPECT_HAS(target.status().message(), "UCX_TLS=no_such_transport");
  }
}
#endif

// Catches: a destructor that waits forever for writes that never complete,
// or crashes on outstanding requests (a trainer torn down mid-refit).
TEST(UcxTransport, DestroyingARemoteWithWritesInFlightIsClean) {
  REFIT_SKIP_WITHOUT_UCX();
  testing::ScopedEnv tls("UCX_TLS", "tcp");
  constexpr std::uint64_t kSlotBytes = 8 << 20;
  ForkedChild engine([&](int up, int down) { return HostPool(up, down, 2, kSlotBytes); });
  const std::string descriptor = ReceiveString(engine.from_child());
  ASSERT_EQ(descriptor.rfind("ucx:", 0), 0u);
  auto t = make_transport("ucx");
  ASSERT_TRUE(t.ok());
  auto remote = (*t)->open_target(descriptor, nullptr);
  ASSERT_OK(remote);
  std::vector<std::byte> bytes(kSlotBytes, std::byte{1});
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*remote)->submit(i % 2, 0, bytes, 1, Deadline::After(1s)).ok());
  const auto start = Clock::now();
  remote->reset();
  EXPECT_LT(Clock::now() - start, 12s);
  char byte = 0;
  ASSERT_TRUE(WriteAll(engine.to_child(), &byte, 1));
  EXPECT_EQ(engine.Wait(), 0);
}

}  // namespace
}  // namespace refit
