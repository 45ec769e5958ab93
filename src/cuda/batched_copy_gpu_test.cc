// GPU tests of BatchedCopier (label gpu): every test poisons the destination,
// copies, downloads it and compares it byte for byte with a host reference
// that applies the same runs, so a missed byte, a stray write (into the
// poisoned gaps between destinations), a wrong pitch or a wrong run shows up
// as the first differing byte and the run it belongs to.
#include <algorithm>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/gpu_test_util.h"
#include "cuda/batched_copy.h"
#include "cuda/device.h"

namespace refit {
namespace {

constexpr std::byte kPoison{0xA5};

// A run as offsets into the test's src and dst buffers.
struct TestRun {
  std::uint64_t src_off, dst_off, row_bytes, rows, src_pitch, dst_pitch;
  int dst_align = -1;  // layout_dst: wanted dst_off % 16, or -1 for any
  std::uint64_t src_extent() const { return rows == 0 ? 0 : (rows - 1) * src_pitch + row_bytes; }
  std::uint64_t dst_extent() const { return rows == 0 ? 0 : (rows - 1) * dst_pitch + row_bytes; }
};

std::string describe(const TestRun& r, std::size_t index) {
  std::ostringstream o;
  o << "run " << index << " {src_off " << r.src_off << ", dst_off " << r.dst_off << ", row_bytes " << r.row_bytes
    << ", rows " << r.rows << ", src_pitch " << r.src_pitch << ", dst_pitch " << r.dst_pitch << "}";
  return o.str();
}

// Places each run's destination after the previous one, with a poisoned gap
// of `gap_max` bytes at most (random), and returns the dst size.
std::uint64_t layout_dst(std::vector<TestRun>& runs, std::mt19937_64& rng, std::uint64_t gap_max) {
  std::uint64_t cursor = rng() % (gap_max + 1);
  for (TestRun& r : runs) {
    if (r.dst_align >= 0) cursor = (cursor + 15) / 16 * 16 + static_cast<std::uint64_t>(r.dst_align);
    r.dst_off = cursor;
    cursor += r.dst_extent() + rng() % (gap_max + 1);
  }
  return cursor + 64;
}

// Holds device src/dst, the host src and the host reference of dst.
class Fixture {
 public:
  Status init(std::uint64_t src_bytes, std::uint64_t dst_bytes, unsigned seed) {
    ASSIGN_OR_RETURN(src_, DeviceBuffer::Allocate(0, src_bytes));
    ASSIGN_OR_RETURN(dst_, DeviceBuffer::Allocate(0, dst_bytes));
    host_src_.resize(src_bytes);
    std::mt19937_64 rng(seed);
    for (std::uint64_t i = 0; i + 8 <= src_bytes; i += 8) {
      const std::uint64_t w = rng();
      std::memcpy(host_src_.data() + i, &w, 8);
    }
    for (std::uint64_t i = src_bytes / 8 * 8; i < src_bytes; ++i) host_src_[i] = static_cast<std::byte>(rng());
    RETURN_IF_ERROR(copy_host_to_device(src_.data(), host_src_));
    return poison();
  }

  Status poison() {
    ref_.assign(dst_.size(), kPoison);
    return device_memset(dst_.data(), static_cast<int>(kPoison), dst_.size());
  }

  std::vector<CopyRun> to_copy_runs(const std::vector<TestRun>& runs) const {
    std::vector<CopyRun> out;
    out.reserve(runs.size());
    for (const TestRun& r : runs) {
      out.push_back(CopyRun{src_.data() + r.src_off, dst_.data() + r.dst_off, r.row_bytes, r.rows, r.src_pitch,
                            r.dst_pitch});
    }
    return out;
  }

  void apply_on_host(const std::vector<TestRun>& runs) {
    for (const TestRun& r : runs) {
      for (std::uint64_t row = 0; row < r.rows; ++row) {
        const std::uint64_t sp = r.rows > 1 ? r.src_pitch : 0, dp = r.rows > 1 ? r.dst_pitch : 0;
        std::memcpy(ref_.data() + r.dst_off + row * dp, host_src_.data() + r.src_off + row * sp, r.row_bytes);
      }
    }
  }

  // Downloads dst and compares it with the reference; on a difference, names
  // the first differing byte, the run whose destination holds it (or "a gap
  // that must stay poisoned") and the count of differing bytes.
  void expect_dst_matches(const std::vector<TestRun>& runs) const {
    std::vector<std::byte> got(dst_.size());
    const Status s = copy_device_to_host(got, dst_.data());
    ASSERT_TRUE(s.ok()) << s.ToString();
    if (got == ref_) return;
    std::uint64_t first = 0, differing = 0;
    bool found = false;
    for (std::uint64_t i = 0; i < got.size(); ++i) {
      if (got[i] != ref_[i]) {
        if (!found) first = i;
        found = true;
        ++differing;
      }
    }
    std::string where = "a gap between destinations (must stay poisoned 0xA5: a stray write)";
    for (std::size_t k = 0; k < runs.size(); ++k) {
      const TestRun& r = runs[k];
      if (first < r.dst_off || first >= r.dst_off + r.dst_extent()) continue;
      const std::uint64_t rel = first - r.dst_off;
      const std::uint64_t dp = r.rows > 1 ? r.dst_pitch : r.row_bytes;
      if (rel % dp >= r.row_bytes) continue;  // between rows of a 2-D run: a gap too
      where = describe(r, k) + ", row " + std::to_string(rel / dp) + ", column " + std::to_string(rel % dp);
      break;
    }
    FAIL() << differing << " of " << got.size() << " dst bytes differ; first at dst offset " << first << " (got 0x"
           << std::hex << static_cast<int>(got[first]) << ", want 0x" << static_cast<int>(ref_[first]) << std::dec
           << ") in " << where;
  }

  std::uint64_t src_size() const { return src_.size(); }

 private:
  DeviceBuffer src_, dst_;
  std::vector<std::byte> host_src_, ref_;
};

class BatchedCopyGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { REFIT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

// Random runs over [0, src_bytes).
TestRun random_1d(std::mt19937_64& rng, std::uint64_t src_bytes, std::uint64_t min_b, std::uint64_t max_b) {
  const std::uint64_t len = min_b + rng() % (max_b - min_b + 1);
  return TestRun{rng() % (src_bytes - len), 0, len, 1, len, len};
}

TestRun random_2d(std::mt19937_64& rng, std::uint64_t src_bytes, std::uint64_t max_row, std::uint64_t max_rows,
              bool aligned) {
  TestRun r{};
  r.row_bytes = 1 + rng() % max_row;
  r.rows = 2 + rng() % (max_rows - 1);
  r.src_pitch = r.row_bytes + rng() % 64;
  r.dst_pitch = r.row_bytes + rng() % 64;
  if (aligned) {  // exercise the 16-byte path in 2-D
    r.row_bytes = (r.row_bytes + 15) / 16 * 16;
    r.src_pitch = (std::max(r.src_pitch, r.row_bytes) + 15) / 16 * 16;
    r.dst_pitch = (std::max(r.dst_pitch, r.row_bytes) + 15) / 16 * 16;
  }
  r.src_off = rng() % (src_bytes - r.src_extent());
  if (aligned) r.src_off &= ~std::uint64_t{15};
  return r;
}

// The main test: thousands of tiny runs (unaligned), 2-D runs with odd and
// aligned pitches, rows longer than a piece, and a few 100+ MB runs (one
// 16-byte aligned, one sharing its misalignment between src and dst, one not),
// in random order, in ONE copy. Catches: any wrong piece/run lookup, wrong
// vector width or head/tail split, a pitch applied to the wrong side, a
// last partial piece dropped, writes past a run's end.
TEST_F(BatchedCopyGpuTest, RandomMixMatchesHostReference) {
  const unsigned seed = 20251129;
  std::mt19937_64 rng(seed);
  const std::uint64_t big = 100ull << 20;
  const std::uint64_t src_bytes = 3 * big + (64ull << 20);
  std::vector<TestRun> runs;
  // Three big runs.
  runs.push_back(TestRun{0, 0, big + 16 * 1000, 1, 0, 0, 0});                 // 16-byte aligned
  runs.push_back(TestRun{big + (16 << 10) + 5, 0, big + 13, 1, 0, 0, 5});     // same misalignment: split
  runs.push_back(TestRun{2 * big + (32 << 10) + 3, 0, big - 7, 1, 0, 0, 0});  // different: byte fallback
  for (TestRun& r : runs) r.src_pitch = r.dst_pitch = r.row_bytes;
  for (int i = 0; i < 4000; ++i) runs.push_back(random_1d(rng, src_bytes, 1, 300));
  for (int i = 0; i < 1000; ++i) runs.push_back(random_1d(rng, src_bytes, 300, 5000));
  for (int i = 0; i < 60; ++i) runs.push_back(random_1d(rng, src_bytes, 30000, 3 << 20));
  for (int i = 0; i < 300; ++i) runs.push_back(random_2d(rng, src_bytes, 300, 64, false));
  for (int i = 0; i < 300; ++i) runs.push_back(random_2d(rng, src_bytes, 3000, 40, i % 2 == 0));
  for (int i = 0; i < 10; ++i) runs.push_back(random_2d(rng, src_bytes, 100000, 5, i % 2 == 0));  // long rows
  std::shuffle(runs.begin(), runs.end(), rng);
  const std::uint64_t dst_bytes = layout_dst(runs, rng, 40);

  Fixture f;
  REFIT_ASSERT_OK(f.init(src_bytes, dst_bytes, seed));
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream stream, CudaStream::Create(0));
  REFIT_ASSERT_OK_AND_ASSIGN(BatchedCopier copier, BatchedCopier::Create(0));
  const std::vector<CopyRun> cr = f.to_copy_runs(runs);
  REFIT_ASSERT_OK(copier.copy(cr, stream.handle()));
  REFIT_ASSERT_OK(copier.synchronize());
  f.apply_on_host(runs);
  f.expect_dst_matches(runs);
  std::uint64_t total = 0;
  for (const TestRun& r : runs) total += r.row_bytes * r.rows;
  EXPECT_EQ(copier.last_bytes(), total);
  EXPECT_GE(copier.last_descriptors(), runs.size());
}

// Every (src misalignment, dst misalignment, length) combination around the
// 16-byte vector path, 1-D and 2-D with pitches that do and do not keep rows
// aligned. Catches: a wrong vector width choice (misaligned 16-byte access
// faults or corrupts), a head/body/tail split off by one, a 2-D pitch that
// breaks alignment on row 1.
TEST_F(BatchedCopyGpuTest, AlignmentMatrix) {
  std::mt19937_64 rng(7);
  const std::uint64_t src_bytes = 8 << 20;
  std::vector<TestRun> runs;
  const std::uint64_t lengths[] = {1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 255, 256, 257, 1000, 4099, 40000, 70001};
  for (std::uint64_t so = 0; so < 18; ++so) {
    for (std::uint64_t dso = 0; dso < 18; ++dso) {
      for (std::uint64_t len : lengths) {
        TestRun r{};
        r.src_off = (rng() % (src_bytes / 2)) / 64 * 64 + so;
        r.row_bytes = len;
        r.rows = 1;
        r.src_pitch = r.dst_pitch = len;
        r.dst_off = dso;  // the misalignment; layout_dst adds a 64-aligned base below
        runs.push_back(r);
      }
      for (std::uint64_t pitch_extra : {0ull, 1ull, 16ull}) {
        TestRun r{};
        r.row_bytes = 48 + so;
        r.rows = 5;
        r.src_pitch = r.row_bytes + pitch_extra;
        r.dst_pitch = (r.row_bytes + 15) / 16 * 16 + pitch_extra;
        r.src_off = (rng() % (src_bytes / 2)) / 64 * 64 + so;
        r.dst_off = dso;
        runs.push_back(r);
      }
    }
  }
  // Lay out destinations at 64-aligned slots plus each run's chosen misalignment.
  std::uint64_t cursor = 64;
  for (TestRun& r : runs) {
    const std::uint64_t mis = r.dst_off;
    r.dst_off = cursor + mis;
    cursor = (r.dst_off + r.dst_extent() + 64 + 63) / 64 * 64;
  }
  Fixture f;
  REFIT_ASSERT_OK(f.init(src_bytes, cursor + 64, 7));
  REFIT_ASSERT_OK_AND_ASSIGN(BatchedCopier copier, BatchedCopier::Create(0));
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream stream, CudaStream::Create(0));
  REFIT_ASSERT_OK(copier.copy(f.to_copy_runs(runs), stream.handle()));
  REFIT_ASSERT_OK(copier.synchronize());
  f.apply_on_host(runs);
  f.expect_dst_matches(runs);
}

// Many copies in flight on one stream (more than the descriptor ring has
// slots), queued behind a large first copy, each with different runs, and a
// chain whose later copies read what earlier ones wrote. Catches: descriptor
// scratch rewritten before the upload or kernel that reads it ran (the later
// copies would run with the wrong descriptors), and copies not stream-ordered.
TEST_F(BatchedCopyGpuTest, ManyCopiesInFlightReuseScratchSafely) {
  std::mt19937_64 rng(11);
  const std::uint64_t src_bytes = 300ull << 20;
  Fixture f;
  std::vector<std::vector<TestRun>> batches;
  // Batch 0: one large run so the following ones queue behind it.
  batches.push_back({TestRun{0, 0, 256ull << 20, 1, 256ull << 20, 256ull << 20}});
  for (int b = 1; b < 3 * BatchedCopier::kSlots + 2; ++b) {
    std::vector<TestRun> runs;
    const int n = 50 + b * 37;  // different descriptor counts per batch
    for (int i = 0; i < n; ++i) runs.push_back(random_1d(rng, src_bytes, 1, 20000));
    batches.push_back(std::move(runs));
  }
  std::vector<TestRun> all;
  for (auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  const std::uint64_t dst_bytes = layout_dst(all, rng, 32);
  std::size_t k = 0;  // copy the laid-out offsets back into the batches
  for (auto& b : batches) {
    for (TestRun& r : b) r.dst_off = all[k++].dst_off;
  }
  REFIT_ASSERT_OK(f.init(src_bytes, dst_bytes, 11));
  REFIT_ASSERT_OK_AND_ASSIGN(BatchedCopier copier, BatchedCopier::Create(0));
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream stream, CudaStream::Create(0));
  for (const auto& b : batches) {
    const std::vector<CopyRun> cr = f.to_copy_runs(b);  // freed right after copy(): copy() must not keep it
    REFIT_ASSERT_OK(copier.copy(cr, stream.handle()));
  }
  REFIT_ASSERT_OK(copier.synchronize());
  f.apply_on_host(all);
  f.expect_dst_matches(all);
}

// Catches: a copier that only works on the stream it first saw, or on the
// legacy default stream not at all.
TEST_F(BatchedCopyGpuTest, WorksOnSeveralStreamsAndTheDefaultStream) {
  std::mt19937_64 rng(5);
  const std::uint64_t src_bytes = 16 << 20;
  std::vector<TestRun> a, b;
  for (int i = 0; i < 500; ++i) a.push_back(random_1d(rng, src_bytes, 1, 9000));
  for (int i = 0; i < 500; ++i) b.push_back(random_1d(rng, src_bytes, 1, 9000));
  std::vector<TestRun> all = a;
  all.insert(all.end(), b.begin(), b.end());
  const std::uint64_t dst_bytes = layout_dst(all, rng, 16);
  for (std::size_t i = 0; i < a.size(); ++i) a[i].dst_off = all[i].dst_off;
  for (std::size_t i = 0; i < b.size(); ++i) b[i].dst_off = all[a.size() + i].dst_off;
  Fixture f;
  REFIT_ASSERT_OK(f.init(src_bytes, dst_bytes, 5));
  REFIT_ASSERT_OK_AND_ASSIGN(BatchedCopier copier, BatchedCopier::Create(0));
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream s1, CudaStream::Create(0));
  REFIT_ASSERT_OK(copier.copy(f.to_copy_runs(a), s1.handle()));
  REFIT_ASSERT_OK(copier.copy(f.to_copy_runs(b), nullptr));
  REFIT_ASSERT_OK(copier.synchronize());
  f.apply_on_host(all);
  f.expect_dst_matches(all);
}

// prepare() once, launch() several times (the plan replayed every refit),
// poisoning the destination between launches. Catches: a prepared table that
// differs from what copy() would build, a launch that depends on copy()'s
// scratch, and a plan that only works once.
TEST_F(BatchedCopyGpuTest, PreparedPlanReplaysBitExact) {
  std::mt19937_64 rng(13);
  const std::uint64_t src_bytes = 64ull << 20;
  std::vector<TestRun> runs;
  for (int i = 0; i < 3000; ++i) runs.push_back(random_1d(rng, src_bytes, 1, 6000));
  for (int i = 0; i < 200; ++i) runs.push_back(random_2d(rng, src_bytes, 2000, 30, i % 2 == 0));
  runs.push_back(random_1d(rng, src_bytes, 20 << 20, 30 << 20));
  std::shuffle(runs.begin(), runs.end(), rng);
  const std::uint64_t dst_bytes = layout_dst(runs, rng, 24);
  Fixture f;
  REFIT_ASSERT_OK(f.init(src_bytes, dst_bytes, 13));
  REFIT_ASSERT_OK_AND_ASSIGN(BatchedCopier copier, BatchedCopier::Create(0));
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream stream, CudaStream::Create(0));
  REFIT_ASSERT_OK_AND_ASSIGN(PreparedCopy plan, copier.prepare(f.to_copy_runs(runs)));
  EXPECT_GE(plan.descriptors(), runs.size());
  f.apply_on_host(runs);
  for (int replay = 0; replay < 3; ++replay) {
    REFIT_ASSERT_OK(f.poison());
    f.apply_on_host(runs);
    REFIT_ASSERT_OK(copier.launch(plan, stream.handle()));
    REFIT_ASSERT_OK(stream.synchronize());
    SCOPED_TRACE("replay " + std::to_string(replay));
    f.expect_dst_matches(runs);
  }
  REFIT_ASSERT_OK_AND_ASSIGN(PreparedCopy empty, copier.prepare({}));
  REFIT_ASSERT_OK(copier.launch(empty, stream.handle()));
  const CopyRun bad[] = {{nullptr, nullptr, 8, 1, 8, 8}};
  EXPECT_FALSE(copier.prepare(bad).ok());
}

// Catches: empty input launching a kernel with zero pieces (an error or a
// hang), empty runs with null pointers rejected, and bad runs accepted or
// reported without their index.
TEST_F(BatchedCopyGpuTest, EmptyRunsAndInvalidRuns) {
  REFIT_ASSERT_OK_AND_ASSIGN(BatchedCopier copier, BatchedCopier::Create(0));
  REFIT_ASSERT_OK(copier.copy({}, nullptr));
  const CopyRun empties[] = {{nullptr, nullptr, 0, 1, 0, 0}, {nullptr, nullptr, 100, 0, 100, 100}};
  REFIT_ASSERT_OK(copier.copy(empties, nullptr));
  REFIT_ASSERT_OK(copier.synchronize());

  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, DeviceBuffer::Allocate(0, 4096));
  const CopyRun null_src[] = {copy_run_1d(buf.data(), buf.data() + 2048, 16), {nullptr, buf.data(), 16, 1, 16, 16}};
  const Status s1 = copier.copy(null_src, nullptr);
  EXPECT_EQ(s1.code(), StatusCode::kInvalidArgument) << s1.ToString();
  EXPECT_NE(s1.message().find("run 1"), std::string::npos) << s1.ToString();
  const CopyRun bad_pitch[] = {{buf.data(), buf.data() + 2048, 64, 4, 64, 32}};
  const Status s2 = copier.copy(bad_pitch, nullptr);
  EXPECT_EQ(s2.code(), StatusCode::kInvalidArgument) << s2.ToString();
  EXPECT_NE(s2.message().find("run 0"), std::string::npos) << s2.ToString();
}

}  // namespace
}  // namespace refit
