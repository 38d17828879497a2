// The engine's W8A8 linear on CPU without the ~20 small aten calls around torch._int_mm
// (suite/embedded/fused.py says why and what it must equal).
//
// Every float operation here is the one the unfused path runs, in the same order, in IEEE
// single precision (built with -ffp-contract=off and without -ffast-math: no fused multiply-add,
// no reassociation, no reciprocal division):
//   quant_rows:   amax = max|x| per row, scale = amax / 127, codes = clamp(round(x / s), -127, 127)
//                 with s = scale, or 1 where scale == 0 (suite.core.quant_formats._int8_core);
//   mm_rescale:   y = out_dtype((float(acc) * xs) * ws), acc = torch._int_mm(codes, w_t), or the float32
//                 mm of the emulated path (Int8Linear).
// The row loops are compiled for AVX-512, AVX2 and baseline x86-64 (GCC target_clones; the
// loader picks the CPU's best at run time), so one build serves every node of a cluster.

#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <tuple>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SUITE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SUITE_CLONES
#endif

namespace {

inline float load(const float* p, int64_t j) { return p[j]; }
inline float load(const uint16_t* p, int64_t j) {  // bfloat16 bits -> float32, exact
  uint32_t u = static_cast<uint32_t>(p[j]) << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

// max |x| of a row as the max of the sign-cleared bit patterns: for non-negative floats the
// integer order is the float order, and inf / NaN are exactly the patterns >= 0x7f800000.
template <typename T>
inline uint32_t absmax_bits(const T* row, int64_t K) {
  uint32_t bits = 0;
  for (int64_t j = 0; j < K; ++j) {
    float v = load(row, j);
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u &= 0x7fffffffu;
    bits = u > bits ? u : bits;
  }
  return bits;
}

// Codes of one row. |x / safe| <= 190.5 for a finite row (scale = amax / 127 rounded, at worst
// to one subnormal ulp), so adding and subtracting 1.5 * 2**23 rounds it half to even (as
// torch.round) with plain adds that vectorize; the clamp is then on integers.
template <typename T>
inline void codes_row(const T* row, int64_t K, float safe, int8_t* out) {
  for (int64_t j = 0; j < K; ++j) {
    float q = load(row, j) / safe;
    q = (q + 12582912.0f) - 12582912.0f;
    int32_t c = static_cast<int32_t>(q);
    c = c < -127 ? -127 : c;
    c = c > 127 ? 127 : c;
    out[j] = static_cast<int8_t>(c);
  }
}

SUITE_CLONES uint32_t absmax_f32(const float* r, int64_t K) { return absmax_bits(r, K); }
SUITE_CLONES uint32_t absmax_bf16(const uint16_t* r, int64_t K) { return absmax_bits(r, K); }
SUITE_CLONES void codes_f32(const float* r, int64_t K, float s, int8_t* o) { codes_row(r, K, s, o); }
SUITE_CLONES void codes_bf16(const uint16_t* r, int64_t K, float s, int8_t* o) { codes_row(r, K, s, o); }

inline uint32_t absmax(const float* r, int64_t K) { return absmax_f32(r, K); }
inline uint32_t absmax(const uint16_t* r, int64_t K) { return absmax_bf16(r, K); }
inline void codes_of(const float* r, int64_t K, float s, int8_t* o) { codes_f32(r, K, s, o); }
inline void codes_of(const uint16_t* r, int64_t K, float s, int8_t* o) { codes_bf16(r, K, s, o); }

template <typename T>
bool quant_rows_impl(const T* x, int64_t M, int64_t K, int8_t* codes, float* scales) {
  std::atomic<bool> finite{true};
  at::parallel_for(0, M, 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint32_t bits = absmax(x + i * K, K);
      if (bits >= 0x7f800000u) finite = false;  // the caller raises; these codes are never used
      float amax;
      std::memcpy(&amax, &bits, 4);
      const float scale = amax / 127.0f;
      scales[i] = scale;
      codes_of(x + i * K, K, scale > 0.0f ? scale : 1.0f, codes + i * K);
    }
  });
  return finite;
}

// x [M, K] float32 | bfloat16 -> (codes int8 [M, K], scales float32 [M, 1], all finite).
std::tuple<at::Tensor, at::Tensor, bool> quant_rows(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.is_cpu(), "quant_rows: x must be a 2-d CPU tensor");
  at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1);
  at::Tensor codes = at::empty({M, K}, xc.options().dtype(at::kChar));
  at::Tensor scales = at::empty({M, 1}, xc.options().dtype(at::kFloat));
  bool finite;
  if (xc.scalar_type() == at::kFloat) {
    finite = quant_rows_impl(xc.data_ptr<float>(), M, K, codes.data_ptr<int8_t>(), scales.data_ptr<float>());
  } else {
    TORCH_CHECK(xc.scalar_type() == at::kBFloat16, "quant_rows: x must be float32 or bfloat16");
    finite = quant_rows_impl(reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()), M, K,
                             codes.data_ptr<int8_t>(), scales.data_ptr<float>());
  }
  return {codes, scales, finite};
}

// One row of the rescale, y = out((float(acc) * s) * ws): acc int32 (the int8 GEMM's exact sums)
// or float32 (the emulated GEMM's, already float).
template <typename A>
inline void rescale_row_f32(const A* acc, float s, const float* ws, int64_t N, float* y) {
  for (int64_t j = 0; j < N; ++j) {
    float v = static_cast<float>(acc[j]) * s;
    y[j] = v * ws[j];
  }
}

// float32 -> bfloat16 rounding to nearest even, as c10::BFloat16 and aten's casts do for every
// non-NaN value (a product of finite scales and a finite sum is never NaN).
template <typename A>
inline void rescale_row_bf16(const A* acc, float s, const float* ws, int64_t N, uint16_t* y) {
  for (int64_t j = 0; j < N; ++j) {
    float v = static_cast<float>(acc[j]) * s;
    v = v * ws[j];
    uint32_t u;
    std::memcpy(&u, &v, 4);
    y[j] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

SUITE_CLONES void rescale_i32_f32(const int32_t* a, float s, const float* w, int64_t N, float* y) {
  rescale_row_f32(a, s, w, N, y);
}
SUITE_CLONES void rescale_i32_bf16(const int32_t* a, float s, const float* w, int64_t N, uint16_t* y) {
  rescale_row_bf16(a, s, w, N, y);
}
SUITE_CLONES void rescale_f32_f32(const float* a, float s, const float* w, int64_t N, float* y) {
  rescale_row_f32(a, s, w, N, y);
}
SUITE_CLONES void rescale_f32_bf16(const float* a, float s, const float* w, int64_t N, uint16_t* y) {
  rescale_row_bf16(a, s, w, N, y);
}
inline void rescale(const int32_t* a, float s, const float* w, int64_t N, float* y) { rescale_i32_f32(a, s, w, N, y); }
inline void rescale(const int32_t* a, float s, const float* w, int64_t N, uint16_t* y) { rescale_i32_bf16(a, s, w, N, y); }
inline void rescale(const float* a, float s, const float* w, int64_t N, float* y) { rescale_f32_f32(a, s, w, N, y); }
inline void rescale(const float* a, float s, const float* w, int64_t N, uint16_t* y) { rescale_f32_bf16(a, s, w, N, y); }

template <typename A, typename Y>
void rescale_rows(const A* acc, const float* xs, const float* ws, int64_t M, int64_t N, Y* y) {
  at::parallel_for(0, M, 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) rescale(acc + i * N, xs[i], ws, N, y + i * N);
  });
}

// codes int8 [M, K]; w_t [K, N] (a transposed view is fine): int8 codes -> torch._int_mm, or the
// same codes stored as float32 (the emulated path: an exact float32 GEMM over integers, the very
// mm F.linear runs); xs float32 [M, 1], ws float32 [1, N] -> out_dtype [M, N].
at::Tensor mm_rescale(const at::Tensor& codes, const at::Tensor& w_t, const at::Tensor& xs, const at::Tensor& ws,
                      at::ScalarType out_dtype) {
  const bool native = w_t.scalar_type() == at::kChar;
  TORCH_CHECK(native || w_t.scalar_type() == at::kFloat, "mm_rescale: w_t must be int8 or float32");
  at::Tensor acc = (native ? at::_int_mm(codes, w_t) : at::mm(codes.to(at::kFloat), w_t)).contiguous();
  const int64_t M = acc.size(0), N = acc.size(1);
  TORCH_CHECK(xs.numel() == M && ws.numel() == N, "mm_rescale: scales do not match [M, N]");
  TORCH_CHECK(xs.scalar_type() == at::kFloat && ws.scalar_type() == at::kFloat, "mm_rescale: scales must be float32");
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kBFloat16, "mm_rescale: out_dtype must be float32 or bfloat16");
  at::Tensor xsc = xs.contiguous(), wsc = ws.contiguous();
  at::Tensor y = at::empty({M, N}, acc.options().dtype(out_dtype));
  const float *sx = xsc.data_ptr<float>(), *sw = wsc.data_ptr<float>();
  if (out_dtype == at::kFloat) {
    if (native) rescale_rows(acc.data_ptr<int32_t>(), sx, sw, M, N, y.data_ptr<float>());
    else rescale_rows(acc.data_ptr<float>(), sx, sw, M, N, y.data_ptr<float>());
  } else {
    uint16_t* yb = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
    if (native) rescale_rows(acc.data_ptr<int32_t>(), sx, sw, M, N, yb);
    else rescale_rows(acc.data_ptr<float>(), sx, sw, M, N, yb);
  }
  return y;
}

}  // namespace

// Registered as torch operators (not bare pybind functions) so that the profiler records them
// by name (suite bench rollout --profile) and they dispatch like any aten call.
TORCH_LIBRARY(suite_fused, m) {
  m.def("quant_rows(Tensor x) -> (Tensor, Tensor, bool)");
  m.def("mm_rescale(Tensor codes, Tensor w_t, Tensor xs, Tensor ws, ScalarType out_dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(suite_fused, CPU, m) {
  m.impl("quant_rows", &quant_rows);
  m.impl("mm_rescale", &mm_rescale);
}
