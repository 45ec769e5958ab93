// An engine rank's bytes of a quantized weight: see fp8_shard.h.
#include "quant/fp8_shard.h"

#include <algorithm>
#include <cstring>
#include <vector>


namespace refit {
namespace {

// A shard as matrices x rows x columns of the full [E, R, C] (E = 1 for a
// 2-D weight) tensor.
struct MatrixBox {
  std::int64_t m0 = 0, matrices = 1, r0 = 0, rows = 0, c0 = 0, cols = 0;
};

MatrixBox shard_box(const Weight& w, int rank, int ranks) {
  const std::vector<std::int64_t>& shape = w.spec.shape;
  const std::size_t nd = shape.size();
  MatrixBox b;
  b.matrices = nd == 3 ? shape[0] : 1;
  b.rows = shape[nd - 2];
  b.cols = shape[nd - 1];
  const ShardSlice s = shard_slice(w, rank, ranks);
  if (s.dim < 0) return b;
  const std::size_t dim = static_cast<std::size_t>(s.dim) + (nd == 2 ? 1 : 0);  // as if [E, R, C]
  std::int64_t* begin[] = {&b.m0, &b.r0, &b.c0};
  std::int64_t* extent[] = {&b.matrices, &b.rows, &b.cols};
  *begin[dim] = s.begin;
  *extent[dim] = s.end - s.begin;
  return b;
}

// A begin on a block edge, and an end on one or at the tensor's end.
bool whole_blocks(std::int64_t begin, std::int64_t extent, std::int64_t size) {
  return begin % kFp8BlockSize == 0 && ((begin + extent) % kFp8BlockSize == 0 || begin + extent == size);
}

}  // namespace

StatusOr<Fp8Box> quantized_shard_box(const Weight& source, int rank, int ranks) {
  RETURN_IF_ERROR(fp8_block_specs(source.spec).status());
  const MatrixBox box = shard_box(source, rank, ranks);
  const std::vector<std::int64_t>& shape = source.spec.shape;
  const std::size_t nd = shape.size();
  if (!whole_blocks(box.r0, box.rows, shape[nd - 2]) || !whole_blocks(box.c0, box.cols, shape[nd - 1])) {
    return InvalidArgument("tensor '" + source.spec.name + "': engine rank " + std::to_string(rank) + " of " +
                           std::to_string(ranks) + " holds rows [" + std::to_string(box.r0) + ", " +
                           std::to_string(box.r0 + box.rows) + ") x columns [" + std::to_string(box.c0) + ", " +
                           std::to_string(box.c0 + box.cols) + "), which cut 128-blocks");
  }
  return Fp8Box{box.m0, box.matrices, box.r0, box.rows, box.c0, box.cols};
}

Fp8Source full_fp8_source(const TensorSpec& spec, const std::byte* full) {
  const std::size_t nd = spec.shape.size();
  return fp8_dense_source(spec.dtype, full, nd == 3 ? spec.shape[0] : 1, spec.shape[nd - 2], spec.shape[nd - 1]);
}

std::uint64_t quantized_shard_bytes(const Weight& source, int rank, int ranks, QuantPart part) {
  const MatrixBox b = shard_box(source, rank, ranks);
  if (part == QuantPart::kCodes) return static_cast<std::uint64_t>(b.matrices * b.rows * b.cols);
  return static_cast<std::uint64_t>(b.matrices * fp8_blocks(b.rows) * fp8_blocks(b.cols)) * sizeof(float);
}

Status quantized_shard_range(const Weight& source, int rank, int ranks, QuantPart part, const std::byte* full,
                             std::uint64_t begin, std::span<std::byte> out, std::uint64_t version) {
  const std::string& name = source.spec.name;
  if (part == QuantPart::kCopy) return InvalidArgument("tensor '" + name + "': a copy is not a quantized part");
  RETURN_IF_ERROR(quantized_shard_box(source, rank, ranks).status());
  const MatrixBox box = shard_box(source, rank, ranks);
  const std::uint64_t total = quantized_shard_bytes(source, rank, ranks, part);
  if (begin > total || out.size() > total - begin) {
    return InvalidArgument("tensor '" + name + "': bytes [" + std::to_string(begin) + ", +" +
                           std::to_string(out.size()) + ") are past engine rank " + std::to_string(rank) +
                           "'s " + std::to_string(total) + " bytes of its " +
                           (part == QuantPart::kCodes ? "codes" : "scales"));
  }
  if (out.empty()) return Status::Ok();
  const bool codes = part == QuantPart::kCodes;
  // The shard as an image of rows: codes rows are the weight's rows, scale
  // rows its block rows; `row_len` elements each.
  const std::int64_t rows = codes ? box.rows : fp8_blocks(box.rows);
  const std::uint64_t row_bytes = static_cast<std::uint64_t>(codes ? box.cols : fp8_blocks(box.cols) * 4);
  const Fp8Source src = full_fp8_source(source.spec, full);
  const std::uint64_t end = begin + out.size();
  std::vector<std::uint8_t> weight;
  std::vector<float> scale;
  for (std::uint64_t g = begin / row_bytes; g * row_bytes < end;) {
    const std::int64_t m = static_cast<std::int64_t>(g) / rows, a = static_cast<std::int64_t>(g) % rows;
    const std::int64_t last = std::min<std::int64_t>(rows - 1, static_cast<std::int64_t>((end - 1) / row_bytes) - m * rows);
    // The full rows whose blocks hold image rows [a, last] of matrix m.
    const std::int64_t q0 = codes ? (box.r0 + a) / kFp8BlockSize * kFp8BlockSize : box.r0 + a * kFp8BlockSize;
    const std::int64_t q1 = std::min(box.r0 + box.rows, codes ? ((box.r0 + last) / kFp8BlockSize + 1) * kFp8BlockSize
                                                              : box.r0 + (last + 1) * kFp8BlockSize);
    const Fp8Box q{box.m0 + m, 1, q0, q1 - q0, box.c0, box.cols};
    RETURN_IF_ERROR(check_fp8_finite(src, q, name, version));
    weight.resize(static_cast<std::size_t>(q.elements()));
    scale.resize(static_cast<std::size_t>(q.scales()));
    RETURN_IF_ERROR(quantize_fp8_block(src, q, weight, scale));
    // Where the quantized rows lie in the shard's bytes, and what of them was asked for.
    const std::int64_t first_row = m * rows + (codes ? q0 - box.r0 : (q0 - box.r0) / kFp8BlockSize);
    const std::uint64_t at = static_cast<std::uint64_t>(first_row) * row_bytes;
    const std::byte* bytes = codes ? reinterpret_cast<const std::byte*>(weight.data())
                                   : reinterpret_cast<const std::byte*>(scale.data());
    const std::uint64_t size = codes ? weight.size() : scale.size() * sizeof(float);
    const std::uint64_t lo = std::max(begin, at), hi = std::min(end, at + size);
    std::memcpy(out.data() + (lo - begin), bytes + (lo - at), hi - lo);
    g = static_cast<std::uint64_t>(m * rows + last + 1);
  }
  return Status::Ok();
}

}  // namespace refit
