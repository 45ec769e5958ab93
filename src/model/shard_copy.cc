#include "model/shard_copy.h"

#include <algorithm>
#include <cstring>

namespace refit {

void append_shard_copy_runs(const Weight& weight, int rank, int ranks, const std::byte* full,
                            std::uint64_t shard_begin, std::uint64_t bytes, std::byte* dst,
                            std::vector<CopyRun>* out) {
  if (bytes == 0) return;
  const ShardRunLayout l = shard_run_layout(weight, rank, ranks);
  if (l.count == 0) return;
  const std::uint64_t end = shard_begin + bytes;
  if (l.count == 1 || l.run == l.stride) {  // the shard is contiguous in the full tensor
    out->push_back(copy_run_1d(full + l.base + shard_begin, dst, bytes));
    return;
  }
  // Shard byte s lives at full byte base + (s / run) * stride + s % run.
  auto src_of = [&](std::uint64_t s) { return full + l.base + (s / l.run) * l.stride + s % l.run; };
  std::uint64_t s = shard_begin;
  if (s % l.run != 0) {  // partial first row
    const std::uint64_t row_end = std::min(end, (s / l.run + 1) * l.run);
    out->push_back(copy_run_1d(src_of(s), dst, row_end - s));
    s = row_end;
  }
  const std::uint64_t whole_rows = (end - s) / l.run;
  if (whole_rows > 0) {
    out->push_back(CopyRun{src_of(s), dst + (s - shard_begin), l.run, whole_rows, l.stride, l.run});
    s += whole_rows * l.run;
  }
  if (s < end) out->push_back(copy_run_1d(src_of(s), dst + (s - shard_begin), end - s));  // partial last row
}

void copy_runs_on_host(std::span<const CopyRun> runs) {
  for (const CopyRun& r : runs) {
    for (std::uint64_t i = 0; i < r.rows; ++i) std::memcpy(r.dst + i * r.dst_pitch, r.src + i * r.src_pitch, r.row_bytes);
  }
}

}  // namespace refit
