// The quotient x / s of the FP8 block format (quant/fp8_block.h) without a
// division per element: what the GPU kernel computes, and what its host
// tests check against the IEEE division the format names.
//
// An IEEE fp32 division (__fdiv_rn) costs a reciprocal approximation, two
// refinements and a range check per element, and its slow path (taken for
// tiny dividends, common in the synthetic weights' 128 binades) stalls the
// warp of any lane that takes it. Within one block s is fixed, so:
//
//   1. x whose code can only be a zero of x's sign (|x| below
//      fp8_nonzero_floor(s)) get that zero, no arithmetic;
//   2. every other x: r = RN(1/s) once per block, q0 = RN(x r), the exact
//      remainder e = x - q0 s (one fma), q = RN(q0 + e r) (one fma).
//
// Step 2 is Markstein's theorem (Handbook of Floating-Point Arithmetic,
// "Markstein's theorem" in the division chapter): if r is 1/s rounded to
// nearest and q0 is within one ulp of x / s (x r is within half an ulp, and
// one more rounding keeps it within one), then RN(q0 + e r) is x / s rounded
// to nearest, provided nothing underflows or overflows. Step 1 is what keeps
// it so: every s the format makes is a normal in [1e-12 / 448, FLT_MAX / 448]
// (so r is normal too), and above the floor |x| >= 2^(Es - 137) (Es the
// biased exponent of s), so x is normal, x / s >= 2^-11, and the remainder
// (about an ulp of x, at least 2^-82) is a normal; and x <= amax keeps x / s
// at most 448 (1 + 2^-23). fp8_quotient_test.cc checks both steps against
// the division for every bf16 x under every scale exponent.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define REFIT_FP8_HOST_DEVICE __host__ __device__
#else
#define REFIT_FP8_HOST_DEVICE
#endif

namespace refit {

// The fp32 bits of x (std::bit_cast is not usable in device code).
REFIT_FP8_HOST_DEVICE inline std::uint32_t fp8_float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
#endif
}

REFIT_FP8_HOST_DEVICE inline float fp8_bits_float(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
#endif
}

// The bits of the smallest magnitude whose e4m3fn code of x / s may be
// nonzero: for |x| bits below it (as unsigned integers, which order
// non-negative floats), the code is a zero of x's sign whatever x's
// mantissa. With Ex, Es the biased exponents, |x| < 2^(Ex - 126) (a
// subnormal x too: Ex = 0, |x| < 2^-126) and s >= 2^(Es - 127), so |x| / s <
// 2^-10 when Ex <= Es - 11: the quotient rounds (fp32, then e4m3, both
// nearest even) to a zero, since the smallest e4m3 subnormal is 2^-9 and
// 2^-10 ties to the even zero. REQUIRES: s a positive normal fp32 with Es >=
// 10 (every s the format makes: s >= 1e-12 / 448 has Es = 78).
REFIT_FP8_HOST_DEVICE constexpr std::uint32_t fp8_nonzero_floor(std::uint32_t s_bits) {
  return ((s_bits >> 23) - 10u) << 23;
}

// x / s rounded to nearest even, or, below `floor` (fp8_nonzero_floor(s)),
// a zero of x's sign (the same e4m3 code). REQUIRES: r is 1/s rounded to
// nearest (__frcp_rn, or 1.0f / s on the host), s as for fp8_nonzero_floor
// and at least |x| / 449 (x within its block's amax), x finite.
REFIT_FP8_HOST_DEVICE inline float fp8_block_quotient(float x, float s, float r, std::uint32_t floor) {
  const std::uint32_t bits = fp8_float_bits(x);
  if ((bits & 0x7FFFFFFFu) < floor) return fp8_bits_float(bits & 0x80000000u);
#if defined(__CUDA_ARCH__)
  const float q0 = __fmul_rn(x, r);  // no contraction into the fma below
#else
  const float q0 = x * r;
#endif
  const float e = fmaf(-q0, s, x);  // exact: q0 is within an ulp of x / s
  return fmaf(e, r, q0);
}

}  // namespace refit
