// FP8 block quantization of a part of a weight that may cut its 128-blocks
// (issue 20, sharded trainers): an FSDP rank holds rows [r0, r1) of a weight,
// and r0 need not be a multiple of 128, so a block can span two ranks.
//
// The format (quant/fp8_block.h) needs each block's amax over the whole
// block. A part cannot compute it alone, so quantizing a part takes two
// steps with an exchange between them:
//
//   1. fp8_part_amax: each rank computes, for every block its part touches,
//      the amax over the elements it holds (a partial amax).
//   2. The ranks that share a block combine their partial amaxes: the block's
//      amax is their maximum (max is exact, associative and commutative, so
//      any order of combining gives the same bits).
//   3. quantize_fp8_part: each rank writes the codes of its own elements with
//      s = fp8_block_scale(amax) of the combined amax, and the scales of the
//      blocks whose first element (top-left) it holds (the block's owner), so
//      every scale is written by exactly one rank.
//
// The parts' codes and the owners' scales, put together, equal
// quantize_fp8_block of the whole weight bit for bit (fp8_part_test.cc).
//
// Thread safety: pure functions over memory the caller owns.
#pragma once

#include <cstdint>
#include <span>

#include "quant/fp8_block.h"
#include "refit/status.h"

namespace refit {

// A part of a weight of `full_rows` x `full_cols` (per matrix; `local`'s
// matrices are whole matrices of a stacked weight): `local` describes the
// part's own memory, matrices x rows x cols, and its element [m, r, c] is the
// weight's element [m, row_offset + r, col_offset + c].
struct Fp8Part {
  Fp8Source local;
  std::int64_t row_offset = 0;
  std::int64_t col_offset = 0;
  std::int64_t full_rows = 0;
  std::int64_t full_cols = 0;
};

// The blocks a part touches, in the weight's block coordinates: block rows
// [row_begin, row_begin + rows) x block columns [col_begin, col_begin + cols)
// of each of the part's matrices. Per-block arrays of a part (amax, scales)
// are dense in this order: [local.matrices, rows, cols].
struct Fp8BlockRange {
  std::int64_t row_begin = 0;
  std::int64_t rows = 0;
  std::int64_t col_begin = 0;
  std::int64_t cols = 0;
  std::int64_t matrices = 0;
  std::int64_t blocks() const { return matrices * rows * cols; }
};

// OK when `part` is well formed (its local source valid, as
// validate_fp8_box checks for the whole local box) and lies inside the
// weight; kInvalidArgument naming the offending value otherwise.
Status validate_fp8_part(const Fp8Part& part);

// The blocks `part` touches (none for an empty part). REQUIRES:
// validate_fp8_part(part) is OK.
Fp8BlockRange fp8_part_blocks(const Fp8Part& part);

// Step 1: amax[b] = max |x| over the part's elements in touched block b
// (fp8_part_blocks order). kInvalidArgument, writing nothing, for an invalid
// part, a span of another size than the range's blocks(), or a NaN or Inf
// (named in the weight's coordinates; callers add the tensor and version).
Status fp8_part_amax(const Fp8Part& part, std::span<float> amax);

// fp8_part_amax's refusal for a non-finite report (quant/fp8_block.h's
// kFp8AllFinite, or (i << 2) | kind over the part's local C order: i =
// (m * local.rows + r) * local.cols + c), as the GPU's step 1 gives it: OK
// for kFp8AllFinite, else the same kInvalidArgument fp8_part_amax returns
// for that element. REQUIRES: validate_fp8_part(part) is OK.
Status fp8_part_nonfinite_status(const Fp8Part& part, std::uint64_t report);

// Whether the part holds block b's first element (row 128 i, column 128 j of
// its matrix): the block's owner, which writes its scale.
bool fp8_part_owns(const Fp8Part& part, std::int64_t block_row, std::int64_t block_col);

// Step 3: `codes` (dense [local.matrices, local.rows, local.cols]) of the
// part's elements with each block's scale fp8_block_scale(amax[b]), `amax`
// holding the combined amax of every touched block (fp8_part_blocks order),
// and scales[b] = that scale for every touched block the part owns (the
// others are left as they are). kInvalidArgument, writing nothing, for an
// invalid part, spans of other sizes, an amax that is negative, NaN or Inf,
// or one below the part's own partial amax for that block (it cannot be the
// combination of every holder's).
Status quantize_fp8_part(const Fp8Part& part, std::span<const float> amax, std::span<std::uint8_t> codes,
                         std::span<float> scales);

}  // namespace refit
