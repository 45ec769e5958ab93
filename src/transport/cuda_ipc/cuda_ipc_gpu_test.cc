// cuda_ipc on a real GPU (label gpu): the checks of the transport conformance
// suite, on device memory. The target lives in the test process; the
// initiator runs in a child process that is this binary re-executed (fork +
// execve), because CUDA does not survive fork once initialized: the child
// sees REFIT_CUDA_IPC_TEST_CHILD in its environment and runs ChildMain from a
// static initializer, before gtest's main, with a fresh CUDA context.
//
// Every test skips with the reason when refit was built without CUDA or no
// CUDA device is visible. Each test says which broken implementation it
// catches ("Catches: ...").
#include <gtest/gtest.h>

#include "cuda/device.h"
#include "net/link.h"
#include "transport/transport.h"

#if REFIT_HAVE_CUDA

#include <cuda_runtime.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

extern char** environ;

namespace refit {
namespace {

using namespace std::chrono_literals;

#define EXPECT_HAS(haystack, needle)                               \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "expected \"" << (needle) << "\" in: " << (haystack)

constexpr char kChildEnv[] = "REFIT_CUDA_IPC_TEST_CHILD";
constexpr int kSlots = 3;
constexpr std::uint64_t kSlotBytes = 200003;  // odd: not aligned
constexpr int kRounds = 4;
constexpr std::byte kFill{0x5A};
constexpr std::byte kGuard{0xA7};

// ------------------------------------------------------------ the write plan
// Both processes derive the same writes; the parent applies them to a model
// of each slot and compares with the slot's bytes (copied back) after kLanded.

struct Write {
  std::uint64_t offset;
  std::uint64_t bytes;
  int index;  // which write of (round, slot)
};

std::vector<Write> WritesFor(int round, int slot, std::uint64_t slot_bytes) {
  if (round == 0) return {{0, slot_bytes, 0}};  // the whole slot
  const std::uint64_t tail = 1 + static_cast<std::uint64_t>((round * 7 + slot) % 64);
  return {
      {static_cast<std::uint64_t>((round * 4099 + slot * 577) % (slot_bytes / 2)),
       1 + static_cast<std::uint64_t>((round * 1237 + slot * 91) % (slot_bytes / 3)), 0},  // middle
      {slot_bytes - tail, tail, 1},                                                          // ends at the end
      {static_cast<std::uint64_t>(round * 13 + slot), 0, 2},                                 // empty
      {static_cast<std::uint64_t>(1 + round * 101 + slot * 3), 17, 3},                       // small, odd offset
  };
}

std::byte PatternByte(int round, int slot, int write, std::uint64_t pos) {
  std::uint64_t x = pos * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(round) << 40) ^
                    (static_cast<std::uint64_t>(slot) << 48) ^ (static_cast<std::uint64_t>(write) << 56);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<std::byte>(x & 0xff);
}

std::vector<std::byte> PatternFor(int round, int slot, const Write& w) {
  std::vector<std::byte> v(w.bytes);
  for (std::uint64_t i = 0; i < w.bytes; ++i) v[i] = PatternByte(round, slot, w.index, w.offset + i);
  return v;
}

// ------------------------------------------------------------ the child

struct ChildSpec {
  std::string address;
  int slots = 0;
  std::uint64_t slot_bytes = 0;
  int source_device = 0;  // where device-memory sources live
  std::string descriptor;
};

std::string SpecText(const ChildSpec& s) {
  return s.address + " " + std::to_string(s.slots) + " " + std::to_string(s.slot_bytes) + " " +
         std::to_string(s.source_device) + " " + s.descriptor;
}

// Checks that need an opened target but no engine: bounds, tickets, a
// descriptor that claims more than was exported. Empty when all pass.
std::string CheckEdges(Transport& transport, RemoteTarget& remote, const ChildSpec& spec) {
  std::ostringstream errors;
  std::vector<std::byte> eleven(11, std::byte{0x33});
  const std::uint64_t sb = spec.slot_bytes;
  struct Case {
    int slot;
    std::uint64_t offset;
    std::size_t bytes;
  };
  const Case cases[] = {
      {-1, 0, 1}, {spec.slots, 0, 1}, {0, sb, 1}, {0, sb + 1, 0}, {spec.slots - 1, sb - 10, 11},
      {0, std::numeric_limits<std::uint64_t>::max() - 4, 10},  // offset + bytes overflows
  };
  for (const Case& c : cases) {
    auto r = remote.submit(c.slot, c.offset, std::span<const std::byte>(eleven.data(), c.bytes), 1,
                           Deadline::After(1s));
    const std::string at = "slot " + std::to_string(c.slot);
    if (r.ok()) {
      errors << "accepted a write of " << c.bytes << " bytes at offset " << c.offset << " into " << at << "\n";
    } else if (r.status().code() != StatusCode::kInvalidArgument ||
               r.status().message().find("out of range") == std::string::npos ||
               r.status().message().find(at) == std::string::npos) {
      errors << "bad out-of-range error: " << r.status().ToString() << "\n";
    }
  }
  if (remote.mapped_slot(-1) != nullptr || remote.mapped_slot(spec.slots) != nullptr) {
    errors << "mapped_slot out of range is not null\n";
  }
  if (remote.mapped_slot(0) == nullptr) errors << "mapped_slot(0) is null on a one-sided transport\n";
  auto unknown = remote.poll(12345);
  if (unknown.ok() || unknown.status().code() != StatusCode::kInvalidArgument) {
    errors << "poll of an unknown ticket: " << unknown.status().ToString() << "\n";
  }
  // A descriptor that claims more memory than was exported.
  std::string big = spec.descriptor;
  const auto at = big.find(":slot_bytes=");
  const auto end = big.find(':', at + 1);
  big = big.substr(0, at) + ":slot_bytes=" + std::to_string(sb * 1000) + big.substr(end);
  auto too_big = transport.open_target(big, nullptr);
  if (too_big.ok() || too_big.status().code() != StatusCode::kFailedPrecondition) {
    errors << "a descriptor larger than its allocation: " << too_big.status().ToString() << "\n";
  }
  return errors.str();
}

// Trainer side: open, check the edges, hello, then per round wait for a
// credit and write every slot three ways (mapped_slot + cudaMemcpy, submit
// from host memory, submit from device memory), then kLanded per slot.
int ChildMain(const ChildSpec& spec) {
  auto fail = [](const std::string& what, const Status& s) {
    std::fprintf(stderr, "cuda_ipc child: %s: %s\n", what.c_str(), s.ToString().c_str());
    return 1;
  };
  const Deadline deadline = Deadline::After(60s);
  auto transport = make_transport("cuda_ipc");
  if (!transport.ok()) return fail("make_transport", transport.status());
  auto link = Link::Connect(spec.address, "test engine", deadline);
  if (!link.ok()) return fail("connect", link.status());
  auto remote = (*transport)->open_target(spec.descriptor, link->get());
  if (!remote.ok()) return fail("open_target", remote.status());
  if (std::string e = CheckEdges(**transport, **remote, spec); !e.empty()) {
    std::fprintf(stderr, "cuda_ipc child: edge checks failed:\n%s", e.c_str());
    return 2;
  }
  auto source = DeviceBuffer::Allocate(spec.source_device, spec.slot_bytes);
  if (!source.ok()) return fail("source buffer", source.status());

  FrameHeader hello;
  hello.type = FrameType::kHello;
  if (Status s = (*link)->send(hello, {}, deadline); !s.ok()) return fail("hello", s);
  for (int round = 0; round < kRounds; ++round) {
    auto credit = (*link)->recv_header(deadline, 0);
    if (!credit.ok()) return fail("credit", credit.status());
    if (credit->type != FrameType::kCredit || credit->a != static_cast<std::uint64_t>(round)) {
      std::fprintf(stderr, "cuda_ipc child: unexpected frame type %d a=%llu\n", static_cast<int>(credit->type),
                   static_cast<unsigned long long>(credit->a));
      return 1;
    }
    for (int slot = 0; slot < spec.slots; ++slot) {
      std::uint64_t total = 0;
      for (const Write& w : WritesFor(round, slot, spec.slot_bytes)) {
        std::vector<std::byte> src = PatternFor(round, slot, w);
        const int way = (w.index + round + slot) % 3;
        if (way == 0) {
          // One-sided through the mapping, as a packer would write in place.
          std::byte* mapped = (*remote)->mapped_slot(slot);
          if (Status s = copy_host_to_device(mapped + w.offset, src); !s.ok()) return fail("mapped write", s);
          // cudaMemcpy from pageable memory may return before the DMA lands.
          if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
            return fail("mapped write", Internal(cudaGetErrorString(e)));
          }
        } else {
          std::span<const std::byte> from = src;
          if (way == 2 && !src.empty()) {
            if (Status s = copy_host_to_device(source->data(), src); !s.ok()) return fail("stage source", s);
            from = std::span<const std::byte>(source->data(), src.size());
          }
          auto ticket = (*remote)->submit(slot, w.offset, from, static_cast<std::uint64_t>(round), deadline);
          if (!ticket.ok()) return fail("submit", ticket.status());
          for (;;) {
            auto done = (*remote)->poll(*ticket);
            if (!done.ok()) return fail("poll", done.status());
            if (*done) break;
            if (deadline.expired()) return fail("poll", DeadlineExceeded("write never completed"));
          }
          auto again = (*remote)->poll(*ticket);  // a completed ticket stays complete
          if (!again.ok() || !*again) return fail("poll again", again.status());
        }
        total += w.bytes;
      }
      FrameHeader landed;
      landed.type = FrameType::kLanded;
      landed.a = static_cast<std::uint64_t>(round);
      landed.b = static_cast<std::uint64_t>(round * spec.slots + slot);
      landed.c = static_cast<std::uint64_t>(slot);
      landed.d = total;
      if (Status s = (*link)->send(landed, {}, deadline); !s.ok()) return fail("landed", s);
    }
  }
  FrameHeader bye;
  bye.type = FrameType::kBye;
  if (Status s = (*link)->send(bye, {}, deadline); !s.ok()) return fail("bye", s);
  return 0;
}

int ChildEntry(const char* text) {
  ChildSpec spec;
  std::istringstream in(text);
  if (!(in >> spec.address >> spec.slots >> spec.slot_bytes >> spec.source_device >> spec.descriptor)) {
    std::fprintf(stderr, "cuda_ipc child: bad %s=\"%s\"\n", kChildEnv, text);
    return 3;
  }
  return ChildMain(spec);
}

// In the re-executed child: run the initiator and exit before gtest starts.
[[maybe_unused]] const bool g_ran_as_child = [] {
  const char* spec = std::getenv(kChildEnv);
  if (spec == nullptr) return false;
  const int rc = ChildEntry(spec);
  std::fflush(nullptr);
  ::_exit(rc);
}();

// ------------------------------------------------------------ the parent

// Kills (by pid) and reaps the child if the test leaves early.
struct Child {
  pid_t pid = -1;
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  int Wait() {
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid) return -1000;
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
};

// Re-executes this binary as the initiator. `env` adds or replaces variables
// ("CUDA_VISIBLE_DEVICES=..."). The gtest filter matches nothing, so a child
// that somehow misses the static initializer runs no test.
void Spawn(Child* child, const ChildSpec& spec, const std::vector<std::string>& env) {
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  ASSERT_GT(n, 0);
  exe[n] = '\0';
  std::vector<std::string> vars;
  auto overridden = [&](const char* entry) {
    const std::string e(entry);
    if (e.rfind(std::string(kChildEnv) + "=", 0) == 0) return true;
    for (const std::string& v : env) {
      if (e.rfind(v.substr(0, v.find('=') + 1), 0) == 0) return true;
    }
    return false;
  };
  for (char** e = environ; *e != nullptr; ++e) {
    if (!overridden(*e)) vars.emplace_back(*e);
  }
  for (const std::string& v : env) vars.push_back(v);
  vars.push_back(std::string(kChildEnv) + "=" + SpecText(spec));
  std::vector<char*> envp;
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::string filter = "--gtest_filter=-*";
  char* argv[] = {exe, filter.data(), nullptr};
  std::fflush(nullptr);
  child->pid = ::fork();
  ASSERT_GE(child->pid, 0);
  if (child->pid == 0) {
    ::execve(exe, argv, envp.data());
    std::fprintf(stderr, "execve(%s) failed: %s\n", exe, std::strerror(errno));
    ::_exit(127);
  }
}

std::vector<std::byte> ReadBack(const std::byte* device_ptr, std::uint64_t bytes) {
  std::vector<std::byte> out(bytes);
  Status s = copy_device_to_host(out, device_ptr);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

// Runs the full protocol against `target`, with the initiator in a child.
void RunCrossProcess(TargetMemory& target, int source_device, const std::vector<std::string>& env = {}) {
  const int slots = target.slots();
  const std::uint64_t slot_bytes = target.slot_bytes();
  ASSERT_EQ(target.memory(), MemoryKind::kCuda);
  for (int s = 0; s < slots; ++s) {
    ASSERT_TRUE(device_memset(target.slot(s), static_cast<int>(kFill), slot_bytes).ok());
  }
  std::vector<std::vector<std::byte>> model(slots, std::vector<std::byte>(slot_bytes, kFill));

  auto listener = Listener::Listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  ChildSpec spec{(*listener)->address(), slots, slot_bytes, source_device, target.descriptor()};
  Child child;
  Spawn(&child, spec, env);
  if (::testing::Test::HasFatalFailure()) return;

  const Deadline deadline = Deadline::After(60s);
  auto link = (*listener)->accept(deadline);
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  auto hello = (*link)->recv_header(deadline, 0);
  ASSERT_TRUE(hello.ok()) << hello.status().ToString() << " (see the child's stderr above)";
  ASSERT_EQ(hello->type, FrameType::kHello);
  ASSERT_TRUE(target.seal().ok());

  for (int round = 0; round < kRounds; ++round) {
    FrameHeader credit;
    credit.type = FrameType::kCredit;
    credit.a = static_cast<std::uint64_t>(round);
    ASSERT_TRUE((*link)->send(credit, {}, deadline).ok());
    for (int landed = 0; landed < slots; ++landed) {
      auto h = (*link)->recv_header(deadline, 0);
      ASSERT_TRUE(h.ok()) << "round " << round << ": " << h.status().ToString();
      ASSERT_EQ(h->type, FrameType::kLanded) << "a one-sided transport sent a frame of type "
                                             << static_cast<int>(h->type);
      ASSERT_EQ(h->a, static_cast<std::uint64_t>(round));
      const int slot = static_cast<int>(h->c);
      ASSERT_GE(slot, 0);
      ASSERT_LT(slot, slots);
      std::uint64_t total = 0;
      for (const Write& w : WritesFor(round, slot, slot_bytes)) {
        auto src = PatternFor(round, slot, w);
        if (!src.empty()) std::memcpy(model[slot].data() + w.offset, src.data(), src.size());
        total += w.bytes;
      }
      EXPECT_EQ(h->d, total);
      const std::vector<std::byte> got = ReadBack(target.slot(slot), slot_bytes);
      if (got != model[slot]) {
        std::uint64_t i = 0;
        while (got[i] == model[slot][i]) ++i;
        ADD_FAILURE() << "round " << round << " slot " << slot << " differs first at byte " << i << ": got "
                      << static_cast<int>(got[i]) << ", want " << static_cast<int>(model[slot][i]);
      }
    }
  }
  auto bye = (*link)->recv_header(deadline, 0);
  ASSERT_TRUE(bye.ok()) << bye.status().ToString();
  EXPECT_EQ(bye->type, FrameType::kBye);
  EXPECT_EQ(child.Wait(), 0) << "the initiator process failed (see its stderr above)";
}

PoolOptions Options(int device = 0, std::string owner = "engine rank 7") {
  PoolOptions o;
  o.slots = kSlots;
  o.slot_bytes = kSlotBytes;
  o.memory = MemoryKind::kCuda;
  o.device = device;
  o.owner = std::move(owner);
  return o;
}

std::string BusId(int device) {
  char bus[32] = {};
  EXPECT_EQ(cudaDeviceGetPCIBusId(bus, sizeof bus, device), cudaSuccess);
  return bus;
}

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as CUDA_VISIBLE_DEVICES takes it.
std::string Uuid(int device) {
  cudaDeviceProp prop{};
  EXPECT_EQ(cudaGetDeviceProperties(&prop, device), cudaSuccess);
  std::string out = "GPU-";
  char hex[3];
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(prop.uuid.bytes[i]));
    out += hex;
  }
  return out;
}

// An in-process pair of Links (a socketpair): a = initiator's, b = target's.
struct LinkPair {
  std::unique_ptr<Link> a, b;
  LinkPair() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) std::abort();
    a = std::make_unique<Link>(sv[0], "engine rank 7");
    b = std::make_unique<Link>(sv[1], "trainer rank 2");
  }
};

class CudaIpcGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_built()) GTEST_SKIP() << "refit was built without CUDA";
    auto n = cuda_device_count();
    if (!n.ok()) GTEST_SKIP() << "needs a CUDA device: " << n.status().ToString();
    devices_ = *n;
    auto t = make_transport("cuda_ipc");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    transport_ = std::move(*t);
  }
  int devices_ = 0;
  std::unique_ptr<Transport> transport_;
};

// Catches: a wrong slot stride or offset, a copy of the wrong length, a
// mapping in the wrong place (writes that never reach the target process),
// completion reported before the copy finished, a host-only copy path (a
// device source), and bounds checks that let a write past the slot.
TEST_F(CudaIpcGpu, WritesFromAnotherProcessLandBitExact) {
  auto target = transport_->create_target(Options());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  RunCrossProcess(**target, 0);
}

// Catches: a peer mapping that is not enabled (cudaIpcMemLazyEnablePeerAccess
// missing) or copies on the wrong device.
TEST_F(CudaIpcGpu, WritesFromAnotherGpuLandBitExact) {
  if (devices_ < 2) GTEST_SKIP() << "needs two CUDA devices (" << devices_ << " visible)";
  auto target = transport_->create_target(Options(1));
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  EXPECT_EQ((*target)->device(), 1);
  RunCrossProcess(**target, 0);
}

// Catches: a descriptor that names the device by local index (the child,
// whose CUDA_VISIBLE_DEVICES shows only the other GPU, would map the wrong
// memory or fail), and an open that cannot reach a GPU it does not see.
TEST_F(CudaIpcGpu, TargetGpuHiddenFromTheInitiatorIsReachedAsAPeer) {
  if (devices_ < 2) GTEST_SKIP() << "needs two CUDA devices (" << devices_ << " visible)";
  auto target = transport_->create_target(Options(1));
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  RunCrossProcess(**target, 0, {"CUDA_VISIBLE_DEVICES=" + Uuid(0)});
}

// Catches: expose_memory that exports from the wrong address (the offset of
// the range inside its allocation lost), writes outside the exposed range,
// and an exposure that frees memory it does not own.
TEST_F(CudaIpcGpu, ExposedMemoryAtAnOffsetLandsBitExactAndNothingElseMoves) {
  constexpr std::uint64_t kBefore = 4099, kAfter = 777;
  const std::uint64_t total = kBefore + kSlotBytes + kAfter;
  auto buffer = DeviceBuffer::Allocate(0, total);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  ASSERT_TRUE(device_memset(buffer->data(), static_cast<int>(kGuard), total).ok());
  {
    auto target = transport_->expose_memory(buffer->data() + kBefore, kSlotBytes, MemoryKind::kCuda, 0);
    ASSERT_TRUE(target.ok()) << target.status().ToString();
    EXPECT_EQ((*target)->slots(), 1);
    EXPECT_EQ((*target)->slot_bytes(), kSlotBytes);
    EXPECT_EQ((*target)->slot(0), buffer->data() + kBefore);
    EXPECT_EQ((*target)->slot(1), nullptr);
    EXPECT_EQ((*target)->memory(), MemoryKind::kCuda);
    EXPECT_EQ((*target)->device(), 0);
    EXPECT_HAS((*target)->descriptor(), ":offset=" + std::to_string(kBefore) + ":");
    RunCrossProcess(**target, 0);
  }
  // The target is gone; the memory is still ours and outside bytes are untouched.
  const std::vector<std::byte> all = ReadBack(buffer->data(), total);
  for (std::uint64_t i = 0; i < kBefore; ++i) ASSERT_EQ(all[i], kGuard) << "byte " << i << " before the range";
  for (std::uint64_t i = kBefore + kSlotBytes; i < total; ++i) ASSERT_EQ(all[i], kGuard) << "byte " << i << " after";
}

TEST_F(CudaIpcGpu, NameShapeCapabilitiesAndDescriptor) {
  EXPECT_EQ(transport_->name(), "cuda_ipc");
  const TransportCapabilities c = transport_->capabilities();
  EXPECT_TRUE(c.one_sided);
  EXPECT_FALSE(c.cross_host);
  EXPECT_FALSE(c.host_memory);
  EXPECT_TRUE(c.device_memory);
  EXPECT_TRUE(c.direct);
  auto target = transport_->create_target(Options());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  const std::string d = (*target)->descriptor();
  EXPECT_EQ(d.rfind("cuda_ipc:dev=" + BusId(0) + ":slots=3:slot_bytes=200003:offset=0:handle=", 0), 0u) << d;
  EXPECT_EQ((*target)->slots(), kSlots);
  EXPECT_EQ((*target)->slot_bytes(), kSlotBytes);
  EXPECT_EQ((*target)->memory(), MemoryKind::kCuda);
  EXPECT_EQ((*target)->device(), 0);
  for (int i = 0; i < kSlots; ++i) {
    ASSERT_NE((*target)->slot(i), nullptr);
    if (i > 0) {
      EXPECT_EQ((*target)->slot(i) - (*target)->slot(i - 1), static_cast<std::ptrdiff_t>(kSlotBytes));
    }
  }
  EXPECT_EQ((*target)->slot(kSlots), nullptr);
  EXPECT_EQ((*target)->slot(-1), nullptr);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, (*target)->slot(0)), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attr.device, 0);
  EXPECT_TRUE((*target)->seal().ok());
  EXPECT_TRUE((*target)->seal().ok()) << "seal must be idempotent";
}

// Catches: a one-sided target that accepts (and maybe reads) a kData frame.
TEST_F(CudaIpcGpu, ReceiveDataIsAProtocolError) {
  auto target = transport_->create_target(Options());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  LinkPair links;
  FrameHeader h;
  h.type = FrameType::kData;
  h.payload_bytes = 8;
  std::vector<std::byte> pl(8, std::byte{1});
  ASSERT_TRUE(links.a->send(h, pl, Deadline::After(1s)).ok());
  auto got = links.b->recv_header(Deadline::After(1s));
  ASSERT_TRUE(got.ok());
  Status s = (*target)->receive_data(*links.b, *got, Deadline::After(1s));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_HAS(s.message(), "trainer rank 2");
  EXPECT_HAS(s.message(), "engine rank 7");
}

// Catches: zero-size or overflowing pools accepted, host pools silently
// allocated on the device, a device that is not visible, errors without the owner.
TEST_F(CudaIpcGpu, CreateTargetRejectsBadOptions) {
  PoolOptions o = Options();
  o.memory = MemoryKind::kHost;
  auto host = transport_->create_target(o);
  ASSERT_FALSE(host.ok());
  EXPECT_EQ(host.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(host.status().message(), "cuda_ipc moves device memory; engine rank 7's pool is host memory");

  o = Options();
  o.slots = 0;
  auto a = transport_->create_target(o);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(a.status().message(), "engine rank 7");
  o = Options();
  o.slot_bytes = 0;
  EXPECT_EQ(transport_->create_target(o).status().code(), StatusCode::kInvalidArgument);
  o = Options();
  o.slots = 2;
  o.slot_bytes = std::numeric_limits<std::uint64_t>::max() / 2 + 1;
  EXPECT_EQ(transport_->create_target(o).status().code(), StatusCode::kInvalidArgument);

  for (int bad_device : {-1, devices_}) {
    auto d = transport_->create_target(Options(bad_device));
    ASSERT_FALSE(d.ok()) << "device " << bad_device;
    EXPECT_EQ(d.status().code(), StatusCode::kFailedPrecondition) << d.status().ToString();
    EXPECT_HAS(d.status().message(), "engine rank 7");
    EXPECT_HAS(d.status().message(), "device");
  }
  // More memory than the GPU has: an error, not a crash.
  o = Options();
  o.slots = 1024;
  o.slot_bytes = 1ull << 40;
  auto huge = transport_->create_target(o);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted) << huge.status().ToString();
  EXPECT_HAS(huge.status().message(), "engine rank 7");
}

// Catches: exposing memory that cudaIpcGetMemHandle cannot export, a range
// running past its allocation, or the wrong device, without a clear error.
TEST_F(CudaIpcGpu, ExposeMemoryRejectsWhatItCannotExport) {
  auto buffer = DeviceBuffer::Allocate(0, 1 << 20);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  auto code = [&](std::byte* base, std::uint64_t bytes, MemoryKind memory, int device) {
    auto t = transport_->expose_memory(base, bytes, memory, device);
    EXPECT_FALSE(t.ok());
    return t.status();
  };
  Status host = code(buffer->data(), 16, MemoryKind::kHost, -1);
  EXPECT_EQ(host.code(), StatusCode::kFailedPrecondition) << host.ToString();
  EXPECT_HAS(host.message(), "host memory");
  EXPECT_EQ(code(nullptr, 16, MemoryKind::kCuda, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(buffer->data(), 0, MemoryKind::kCuda, 0).code(), StatusCode::kInvalidArgument);
  Status past = code(buffer->data() + 16, 1 << 20, MemoryKind::kCuda, 0);
  EXPECT_EQ(past.code(), StatusCode::kInvalidArgument) << past.ToString();
  EXPECT_HAS(past.message(), "past the end of its allocation");
  std::vector<std::byte> pageable(64);
  Status not_device = code(pageable.data(), pageable.size(), MemoryKind::kCuda, 0);
  EXPECT_EQ(not_device.code(), StatusCode::kFailedPrecondition) << not_device.ToString();
  EXPECT_HAS(not_device.message(), "not device memory");
  if (devices_ >= 2) {
    Status wrong = code(buffer->data(), 16, MemoryKind::kCuda, 1);
    EXPECT_EQ(wrong.code(), StatusCode::kFailedPrecondition) << wrong.ToString();
    EXPECT_HAS(wrong.message(), "on device 0");
  }
  // Stream-ordered allocations cannot be exported with cudaIpcGetMemHandle.
  void* async_mem = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  if (cudaMallocAsync(&async_mem, 1 << 20, nullptr) == cudaSuccess && cudaStreamSynchronize(nullptr) == cudaSuccess) {
    Status pool = code(static_cast<std::byte*>(async_mem), 1 << 20, MemoryKind::kCuda, 0);
    EXPECT_NE(pool.code(), StatusCode::kOk);
    EXPECT_HAS(pool.message(), "only memory from cudaMalloc can be exported");
    EXPECT_EQ(cudaFreeAsync(async_mem, nullptr), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  }
  (void)cudaGetLastError();
  // A whole allocation is fine, and exposing it twice is too.
  auto whole = transport_->expose_memory(buffer->data(), 1 << 20, MemoryKind::kCuda, 0);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  auto twice = transport_->expose_memory(buffer->data(), 1 << 20, MemoryKind::kCuda, 0);
  ASSERT_TRUE(twice.ok()) << twice.status().ToString();
}

// Catches: a lax descriptor parser reached through the transport, the wrong
// transport's descriptor accepted, errors that do not quote the descriptor.
TEST_F(CudaIpcGpu, BadDescriptorIsRejected) {
  auto target = transport_->create_target(Options());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  const std::string good = (*target)->descriptor();
  std::vector<std::string> bad = {"", "garbage", "cuda_ipc:", good + "x", good + ":", " " + good, good + " ",
                                  good.substr(0, good.size() - 1)};
  auto replace = [&](const std::string& from, const std::string& to) {
    auto at = good.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    auto end = good.find(':', at + from.size());
    if (end == std::string::npos) end = good.size();
    bad.push_back(good.substr(0, at) + to + good.substr(end));
  };
  replace(":slots=", ":slots=0");
  replace(":slots=", ":slots=-1");
  replace(":slots=", ":slots=");
  replace(":slots=", ":slots=+2");
  replace(":slot_bytes=", ":slot_bytes=0");
  replace(":slot_bytes=", ":slot_bytes=0x100");
  replace(":slot_bytes=", ":slot_bytes=99999999999999999999999");
  replace(":offset=", ":offset=-1");
  replace(":handle=", ":handle=" + std::string(128, 'G'));
  for (const std::string& name : transport_names()) {
    if (name == "cuda_ipc") continue;
    auto t = make_transport(name);
    ASSERT_TRUE(t.ok());
    if (!(*t)->capabilities().host_memory) continue;  // nccl: device pools only
    PoolOptions o = Options();
    o.memory = MemoryKind::kHost;
    auto other = (*t)->create_target(o);
    ASSERT_TRUE(other.ok()) << other.status().ToString();
    bad.push_back((*other)->descriptor());
  }
  LinkPair links;
  for (const std::string& d : bad) {
    auto r = transport_->open_target(d, links.a.get());
    ASSERT_FALSE(r.ok()) << "accepted descriptor \"" << d << "\"";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    EXPECT_HAS(r.status().message(), "\"" + d + "\"");
  }
}

// Catches: passing CUDA's own error for a handle of this same process
// through unexplained (or crashing on it).
TEST_F(CudaIpcGpu, OpeningATargetOfThisSameProcessIsRefused) {
  auto target = transport_->create_target(Options());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  LinkPair links;
  auto r = transport_->open_target((*target)->descriptor(), links.a.get());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_HAS(r.status().message(), "same process");
  EXPECT_HAS(r.status().message(), "engine rank 7");
}

// Catches: an open that trusts a well-formed but foreign handle (a crash or a
// mapping of nothing) instead of failing with the descriptor named.
TEST_F(CudaIpcGpu, AHandleNoProcessExportedFailsCleanly) {
  auto target = transport_->create_target(Options());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  std::string d = (*target)->descriptor();
  const auto at = d.find(":handle=") + 8;
  d = d.substr(0, at) + std::string(128, '0');
  auto r = transport_->open_target(d, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_HAS(r.status().message(), "\"" + d + "\"");
  EXPECT_HAS(r.status().message(), "cudaIpcOpenMemHandle");
  (void)cudaGetLastError();
}

// Catches: a destructor that does not free the pool (device memory leaks one
// pool per refit setup).
TEST_F(CudaIpcGpu, DestroyingATargetFreesItsMemory) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  std::size_t free_before = 0, free_after = 0, total = 0;
  constexpr std::uint64_t kPool = 2ull << 30;
  auto warm = transport_->create_target(Options());  // contexts and handles warmed up
  ASSERT_TRUE(warm.ok()) << warm.status().ToString();
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  for (int i = 0; i < 3; ++i) {
    PoolOptions o = Options();
    o.slots = 2;
    o.slot_bytes = kPool / 2;
    auto t = transport_->create_target(o);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
  }
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_GE(free_after + (256ull << 20), free_before) << "free device memory fell by "
                                                      << (free_before - free_after) << " bytes";
}

}  // namespace
}  // namespace refit

#else  // !REFIT_HAVE_CUDA

TEST(CudaIpcGpu, NeedsCuda) { GTEST_SKIP() << "refit was built without CUDA: cuda_ipc is not built"; }

#endif  // REFIT_HAVE_CUDA
