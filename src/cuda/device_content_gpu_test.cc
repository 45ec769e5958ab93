// GPU tests of refit/device_content.h (label gpu): the device functions must
// reproduce refit/content.h byte for byte (other processes verify with the
// host function), and the mismatch search must return the exact first byte.
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/gpu_test_util.h"
#include "refit/content.h"
#include "cuda/device.h"
#include "cuda/device_content.h"

namespace refit {
namespace {

constexpr std::byte kPoison{0xA5};

class DeviceContentGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { REFIT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

std::vector<std::byte> host_content(std::uint64_t key, std::uint64_t offset, std::uint64_t n) {
  std::vector<std::byte> v(n);
  fill_content(key, offset, v);
  return v;
}

// Catches: any difference from the host byte function (word order, word index
// off by one, the funnel shift for offsets that are not multiples of 8, the
// head/tail bytes around 16-byte boundaries of dst) and writes outside
// [dst, dst + bytes) (the guard bytes on both sides stay poisoned).
TEST_F(DeviceContentGpuTest, FillMatchesHostFillContent) {
  const std::uint64_t cap = 40ull << 20;
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, DeviceBuffer::Allocate(0, cap + 64));
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream stream, CudaStream::Create(0));
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 240; ++trial) {
    const std::uint64_t key = rng();
    const std::uint64_t offset = trial % 3 == 0 ? rng() % 64 : rng() % (1ull << 40);
    std::uint64_t len;
    if (trial < 120) {
      len = rng() % 100;
    } else if (trial < 230) {
      len = 100 + rng() % 200000;
    } else {
      len = cap - 64 + rng() % 64;  // large, odd
    }
    const std::uint64_t at = 16 + rng() % 32;  // dst misalignment 0..15 (and a guard before)
    REFIT_ASSERT_OK(device_memset(buf.data(), static_cast<int>(kPoison), buf.size()));
    REFIT_ASSERT_OK(fill_content_device(key, offset, buf.data() + at, len, stream.handle()));
    REFIT_ASSERT_OK(stream.synchronize());
    std::vector<std::byte> got(len + 2);
    REFIT_ASSERT_OK(copy_device_to_host(got, buf.data() + at - 1));
    ASSERT_EQ(got.front(), kPoison) << "wrote before dst (trial " << trial << ", len " << len << ")";
    ASSERT_EQ(got.back(), kPoison) << "wrote past dst + bytes (trial " << trial << ", len " << len << ")";
    const std::vector<std::byte> want = host_content(key, offset, len);
    const auto mm = std::mismatch(want.begin(), want.end(), got.begin() + 1);
    ASSERT_TRUE(mm.first == want.end()) << "trial " << trial << ": key " << key << ", offset " << offset << ", len "
                                        << len << ", dst % 16 = " << at % 16 << ": first difference at byte "
                                        << (mm.first - want.begin());
  }
}

// Catches: a search that misses a single flipped byte in the head, body or
// tail, reports the start of its 16-byte vector or word instead of the byte,
// or reports an offset relative to the wrong base.
TEST_F(DeviceContentGpuTest, MismatchFindsASingleFlippedByteAnywhere) {
  const std::uint64_t n = (16ull << 20) + 5;
  const std::uint64_t key = 0x1234567890ABCDEFull, offset = 12345;
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, DeviceBuffer::Allocate(0, n + 16));
  std::byte* p = buf.data() + 3;  // unaligned start: head, body and tail all non-empty
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream stream, CudaStream::Create(0));
  REFIT_ASSERT_OK(fill_content_device(key, offset, p, n, stream.handle()));
  REFIT_ASSERT_OK(stream.synchronize());
  REFIT_ASSERT_OK_AND_ASSIGN(std::int64_t none, first_content_mismatch_device(key, offset, p, n, stream.handle()));
  ASSERT_EQ(none, -1) << "a correct fill reported a mismatch";

  std::mt19937_64 rng(9);
  std::vector<std::uint64_t> positions;
  for (std::uint64_t i = 0; i < 40; ++i) positions.push_back(i);
  for (std::uint64_t i = 0; i < 40; ++i) positions.push_back(n - 1 - i);
  for (int i = 0; i < 60; ++i) positions.push_back(rng() % n);
  for (const std::uint64_t pos : positions) {
    const std::byte orig = host_content(key, offset + pos, 1)[0];
    const std::byte flipped = orig ^ std::byte{static_cast<unsigned char>(1u << (pos % 8))};
    REFIT_ASSERT_OK(copy_host_to_device(p + pos, {&flipped, 1}));
    REFIT_ASSERT_OK_AND_ASSIGN(std::int64_t at, first_content_mismatch_device(key, offset, p, n, stream.handle()));
    EXPECT_EQ(at, static_cast<std::int64_t>(pos)) << "flipped byte " << pos << " of " << n;
    // The same bytes seen from a later start (another head/body split).
    const std::uint64_t skip = std::min<std::uint64_t>(pos, 1 + pos % 17);
    REFIT_ASSERT_OK_AND_ASSIGN(std::int64_t at2, first_content_mismatch_device(key, offset + skip, p + skip, n - skip,
                                                                              stream.handle()));
    EXPECT_EQ(at2, static_cast<std::int64_t>(pos - skip)) << "flipped byte " << pos << ", checked from " << skip;
    REFIT_ASSERT_OK(copy_host_to_device(p + pos, {&orig, 1}));
  }
  REFIT_ASSERT_OK_AND_ASSIGN(none, first_content_mismatch_device(key, offset, p, n, nullptr));
  EXPECT_EQ(none, -1) << "restoring every byte must verify again (default stream)";
}

// Catches: "any mismatch" instead of "the first" (a race where the last
// writer wins, atomicMax, or an early exit that skips lower offsets).
TEST_F(DeviceContentGpuTest, SeveralFlipsReportTheFirst) {
  const std::uint64_t n = 64ull << 20;
  const std::uint64_t key = 77, offset = 8;
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, DeviceBuffer::Allocate(0, n));
  REFIT_ASSERT_OK(fill_content_device(key, offset, buf.data(), n, nullptr));
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::uint64_t> pos;
    for (int i = 0; i < 1 + trial % 5; ++i) pos.push_back(rng() % n);
    for (std::uint64_t q : pos) {
      const std::byte bad = ~host_content(key, offset + q, 1)[0];
      REFIT_ASSERT_OK(copy_host_to_device(buf.data() + q, {&bad, 1}));
    }
    REFIT_ASSERT_OK_AND_ASSIGN(std::int64_t at, first_content_mismatch_device(key, offset, buf.data(), n, nullptr));
    EXPECT_EQ(at, static_cast<std::int64_t>(*std::min_element(pos.begin(), pos.end()))) << "trial " << trial;
    for (std::uint64_t q : pos) {
      const std::byte good = host_content(key, offset + q, 1)[0];
      REFIT_ASSERT_OK(copy_host_to_device(buf.data() + q, {&good, 1}));
    }
  }
}

// The device search equals the host search on arbitrary bytes (poison, a
// wrong key, a wrong offset, partially right data), for random alignments.
// Catches: any disagreement with refit::first_content_mismatch.
TEST_F(DeviceContentGpuTest, AgreesWithHostSearch) {
  const std::uint64_t cap = 1 << 20;
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, DeviceBuffer::Allocate(0, cap + 64));
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    const std::uint64_t key = rng(), offset = rng() % 100000;
    const std::uint64_t at = rng() % 32, len = rng() % (trial < 100 ? 64 : cap);
    REFIT_ASSERT_OK(device_memset(buf.data(), static_cast<int>(kPoison), buf.size()));
    const std::uint64_t good = trial % 4 == 0 ? 0 : rng() % (len + 1);  // a right prefix, then poison
    const std::uint64_t fill_key = trial % 4 == 1 ? key + 1 : key;      // or wrong content entirely
    REFIT_ASSERT_OK(fill_content_device(fill_key, offset, buf.data() + at, good, nullptr));
    std::vector<std::byte> host(len);
    REFIT_ASSERT_OK(copy_device_to_host(host, buf.data() + at));
    const std::int64_t want = first_content_mismatch(key, offset, host);
    REFIT_ASSERT_OK_AND_ASSIGN(std::int64_t got,
                               first_content_mismatch_device(key, offset, buf.data() + at, len, nullptr));
    ASSERT_EQ(got, want) << "trial " << trial << ": len " << len << ", right prefix " << good << ", src % 16 = "
                         << at % 16 << ", offset " << offset;
  }
  REFIT_ASSERT_OK_AND_ASSIGN(std::int64_t empty, first_content_mismatch_device(1, 2, buf.data(), 0, nullptr));
  EXPECT_EQ(empty, -1);
}

// A row-sharded shard checked in one launch: row r of the shard holds the
// full tensor's content at offset + r * stride. Rows of an odd length start at
// every alignment. Catches: rows read at r * stride in the shard (instead of
// r * run), content offsets without the stride, a mismatch reported relative
// to its row instead of the shard, rows beyond gridDim.y skipped (more rows
// than block rows), and "any mismatch" instead of the first across rows.
TEST_F(DeviceContentGpuTest, RowsAreCheckedInOneCallAndTheFirstWrongByteIsExact) {
  const std::uint64_t key = 0xFEEDull, offset = 5;
  for (const std::uint64_t run : {std::uint64_t{1}, std::uint64_t{37}, std::uint64_t{4094}, std::uint64_t{70001}}) {
    const std::uint64_t count = run > 4096 ? 300 : 9000;  // 9000 rows: more than the grid has block rows
    const ContentRows rows{offset, 3 * run + 2, run, count};
    const std::uint64_t n = run * count;
    REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, DeviceBuffer::Allocate(0, n + 1));
    std::byte* p = buf.data() + 1;  // every row at another alignment
    std::vector<std::byte> host(n);
    for (std::uint64_t r = 0; r < count; ++r) {
      fill_content(key, offset + r * rows.stride, std::span<std::byte>(host.data() + r * run, run));
    }
    REFIT_ASSERT_OK(copy_host_to_device(p, host));
    REFIT_ASSERT_OK_AND_ASSIGN(std::int64_t none, first_content_mismatch_device(key, rows, p, nullptr));
    ASSERT_EQ(none, -1) << "rows of " << run << " bytes: a correct shard reported a mismatch";

    std::mt19937_64 rng(run);
    std::vector<std::uint64_t> positions{0, n - 1, run - 1, run, (count / 2) * run + run / 2};
    for (int i = 0; i < 12; ++i) positions.push_back(rng() % n);
    for (const std::uint64_t pos : positions) {
      const std::byte orig = host[pos];
      const std::byte bad = ~orig;
      REFIT_ASSERT_OK(copy_host_to_device(p + pos, {&bad, 1}));
      // A second flip later in the shard (another row where there is one) must not win.
      const std::uint64_t later = std::min(n - 1, pos + run + 1);
      const std::byte later_orig = host[later];
      const std::byte later_bad = ~later_orig;
      if (later != pos) REFIT_ASSERT_OK(copy_host_to_device(p + later, {&later_bad, 1}));
      REFIT_ASSERT_OK_AND_ASSIGN(std::int64_t at, first_content_mismatch_device(key, rows, p, nullptr));
      EXPECT_EQ(at, static_cast<std::int64_t>(pos)) << "rows of " << run << " bytes: flipped shard byte " << pos
                                                    << " (row " << pos / run << ")";
      REFIT_ASSERT_OK(copy_host_to_device(p + pos, {&orig, 1}));
      if (later != pos) REFIT_ASSERT_OK(copy_host_to_device(p + later, {&later_orig, 1}));
    }
  }
}

// Content that changes like an optimizer step (ContentKey, 5% per
// version): the device fill equals the host fill byte for byte (offsets
// not at element boundaries included), and the row search finds a flipped
// byte. Catches: the device and host rules disagreeing (the 128-bit step
// count, the phase, the element index), a row offset not carried in.
TEST_F(DeviceContentGpuTest, ChangingContentMatchesTheHostAndIsSearchedByRows) {
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, DeviceBuffer::Allocate(0, 1 << 20));
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream stream, CudaStream::Create(0));
  const ContentKey key = make_content_key(9, 7, "layers.0.w", *change_parts(0.05), 2);
  for (std::uint64_t offset : {0ull, 3ull, 4096ull + 1}) {
    const std::uint64_t len = 300000;
    REFIT_ASSERT_OK(fill_content_device(key, offset, buf.data(), len, stream.handle()));
    REFIT_ASSERT_OK(stream.synchronize());
    std::vector<std::byte> got(len), want(len);
    REFIT_ASSERT_OK(copy_device_to_host(got, buf.data()));
    fill_content(key, offset, want);
    ASSERT_EQ(got, want) << "offset " << offset;
  }
  // Rows: 4 rows of 1000 bytes, stride 3000, from offset 10.
  const ContentRows rows{10, 3000, 1000, 4};
  std::vector<std::byte> shard(4000);
  for (std::uint64_t r = 0; r < 4; ++r) fill_content(key, 10 + r * 3000, std::span<std::byte>(&shard[r * 1000], 1000));
  REFIT_ASSERT_OK(copy_host_to_device(buf.data(), shard));
  REFIT_ASSERT_OK_AND_ASSIGN(std::int64_t none, first_content_mismatch_device(key, rows, buf.data(), stream.handle()));
  EXPECT_EQ(none, -1);
  shard[2345] ^= std::byte{1};
  REFIT_ASSERT_OK(copy_host_to_device(buf.data(), shard));
  REFIT_ASSERT_OK_AND_ASSIGN(std::int64_t at, first_content_mismatch_device(key, rows, buf.data(), stream.handle()));
  EXPECT_EQ(at, 2345);
}

}  // namespace
}  // namespace refit
