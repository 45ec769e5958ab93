// The canonical little-endian encoding the transfer plans' digests hash
// (transfer_plan.cc, mapped_transfer_plan.cc). Private to src/reshard/.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "refit/layout.h"
#include "refit/tensor.h"
#include "refit/transfer_plan.h"

namespace refit::transfer_plan_detail {

class Encoder {
 public:
  void u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void text(std::string_view s) {
    u64(s.size());
    out_.append(s);
  }
  // Name, dtype, rank and extents.
  void spec(const TensorSpec& spec) {
    text(spec.name);
    u64(static_cast<std::uint64_t>(spec.dtype));
    u64(spec.shape.size());
    for (std::int64_t d : spec.shape) u64(static_cast<std::uint64_t>(d));
  }
  void layout(const Layout& l) {
    u64(static_cast<std::uint64_t>(l.order));
    u64(l.levels.size());
    for (const LayoutLevel& level : l.levels) {
      u64(static_cast<std::uint64_t>(level.kind));
      u64(static_cast<std::uint64_t>(level.dim));
      u64(static_cast<std::uint64_t>(level.ranks));
      if (level.kind == LevelKind::kOwner) u64(static_cast<std::uint64_t>(level.owner));  // older kinds: as before
    }
    if (l.blocks) {  // layouts without a block table: as before
      u64(static_cast<std::uint64_t>(l.blocks->block));
      u64(l.blocks->shape.size());
      for (std::int64_t d : l.blocks->shape) u64(static_cast<std::uint64_t>(d));
    }
  }
  void box(const Box& b) {
    u64(b.begin.size());
    for (std::size_t d = 0; d < b.begin.size(); ++d) {
      u64(static_cast<std::uint64_t>(b.begin[d]));
      u64(static_cast<std::uint64_t>(b.end[d]));
    }
  }
  // A run's fields; `with_source` adds src_tensor (mapped plans only, so
  // that an identity plan's digest is what it was before src_tensor).
  void run(const TransferRun& r, bool with_source) {
    u64(r.tensor);
    u64(r.src_offset);
    u64(r.dst_offset);
    u64(r.bytes);
    u64(r.count);
    u64(r.src_stride);
    u64(r.dst_stride);
    if (with_source) u64(r.src_tensor);
  }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

}  // namespace refit::transfer_plan_detail
