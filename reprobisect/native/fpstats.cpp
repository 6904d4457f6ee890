// Fingerprint row sums and summary statistics of one tensor in one pass over its bytes.
//
// The same algorithm as reprobisect/trace/fingerprint.py (read that docstring first): the
// bytes, zero-padded to a multiple of 4, are signed 32-bit lanes cut into rows of ROW
// lanes; each row reduces to sum(sign_extend(lane[j]) * weight[j]) modulo 2**64. Integer
// arithmetic, so any order and any vector width give the same row sums as NumPy and torch.
//
// The statistics (sum, sum of squares, min, max) are accumulated in float64 over 16
// interleaved accumulators per fixed chunk of CHUNK_ROWS rows, and the chunks are combined
// in order; NaN and Inf are counted in a second pass only when the sum is not finite.
// Built with -ffp-contract=off and no fast-math, the result is defined by the C++ source
// alone: the same bits give the same statistics on any IEEE-754 machine, whatever its
// vector width. The AVX-512 and AVX2 paths (used when the build targets such a CPU) do
// exactly the scalar code's operations in the same order per accumulator; tests build the
// machine's path and a portable one and compare the bits.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>
#define RB_AVX512 1
#elif defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define RB_AVX2 1
#endif

namespace {

constexpr int64_t ROW = 4096;
constexpr int64_t CHUNK_ROWS = 16;  // 64K lanes, 256 KiB: the unit the statistics are combined by
constexpr int64_t CHUNK_BYTES = CHUNK_ROWS * ROW * 4;
constexpr int K = 16;  // interleaved accumulators
constexpr int MAX_DIMS = 16;
constexpr int64_t PREFETCH_BYTES = 8192;  // software prefetch this far ahead: the fused loop
// keeps the core busy enough that the hardware prefetcher alone left it at half memory speed
// (6 vs 13 GB/s on 64 MiB of float32, measured); past the end it is a harmless hint

enum Dtype : int {
  NONE = 0, F32 = 1, F64 = 2, BF16 = 3, F16 = 4, I64 = 5, I32 = 6, I16 = 7, I8 = 8, U8 = 9, BOOL = 10,
  U16 = 11, U32 = 12, U64 = 13,
};

struct Partial {
  double sum = 0, sq = 0, mn = INFINITY, mx = -INFINITY;
};

template <typename T>
inline T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float f16_to_f32(uint16_t h) {
  _Float16 v;
  std::memcpy(&v, &h, 2);
  return float(v);
}

#ifdef RB_AVX512
// 16 lanes into two 8 x 64-bit accumulators: sign-extend, multiply by the weights, add.
inline void fp16(__m512i v, const uint64_t* w, __m512i& a0, __m512i& a1) {
  __m512i l0 = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(v));
  __m512i l1 = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1));
  a0 = _mm512_add_epi64(a0, _mm512_mullo_epi64(l0, _mm512_loadu_si512(w)));
  a1 = _mm512_add_epi64(a1, _mm512_mullo_epi64(l1, _mm512_loadu_si512(w + 8)));
}

inline int64_t fp_total(__m512i a0, __m512i a1) {
  alignas(64) uint64_t t[8];
  _mm512_store_si512(t, _mm512_add_epi64(a0, a1));
  uint64_t s = 0;
  for (int k = 0; k < 8; ++k) s += t[k];
  return int64_t(s);
}
#endif

#ifdef RB_AVX2
// AVX2 has no 64-bit multiply (the compiler's emulation left the row sum compute-bound at
// about half memory speed). Per lane l and weight w = hi * 2**32 + lo:
//   sign_extend(l) * w = u * lo + 2**32 * (u * hi - lo * [l < 0])  (mod 2**64),
// with u the lane's 32 bits read unsigned. u * lo is exact in 64 bits (vpmuludq, even and
// odd lanes); of the second term only the low 32 bits count, so it is summed in 32-bit
// lanes (vpmulld, and lo where the lane is negative) and shifted in at the row's end. The
// weights' low and high halves are split once per thread into lane-ordered tables.
struct SplitWeights {
  const uint64_t* src = nullptr;
  alignas(32) uint32_t lo[ROW], hi[ROW];
};

inline const SplitWeights& split(const uint64_t* w) {
  static thread_local SplitWeights t;
  if (t.src != w) {
    for (int64_t j = 0; j < ROW; ++j) {
      t.lo[j] = uint32_t(w[j]);
      t.hi[j] = uint32_t(w[j] >> 32);
    }
    t.src = w;
  }
  return t;
}

struct Fp8 {
  __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256(), high = _mm256_setzero_si256();

  // eight lanes at q, the weights' halves at lo and hi
  inline void add(const unsigned char* q, const uint32_t* lo, const uint32_t* hi) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    __m256i l = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
    __m256i h = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
    even = _mm256_add_epi64(even, _mm256_mul_epu32(v, l));
    odd = _mm256_add_epi64(odd, _mm256_mul_epu32(_mm256_srli_epi64(v, 32), _mm256_srli_epi64(l, 32)));
    __m256i neg = _mm256_and_si256(_mm256_srai_epi32(v, 31), l);
    high = _mm256_add_epi32(high, _mm256_sub_epi32(_mm256_mullo_epi32(v, h), neg));
  }

  inline uint64_t total() const {
    alignas(32) uint64_t t[4];
    alignas(32) uint32_t u[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(t), _mm256_add_epi64(even, odd));
    _mm256_store_si256(reinterpret_cast<__m256i*>(u), high);
    uint32_t hsum = 0;
    for (int k = 0; k < 8; ++k) hsum += u[k];
    return t[0] + t[1] + t[2] + t[3] + (uint64_t(hsum) << 32);
  }
};
#endif

// The sum of one whole row (ROW lanes starting at q).
int64_t row_sum(const unsigned char* q, const uint64_t* w) {
#if defined(RB_AVX2)
  const SplitWeights& sw = split(w);
  Fp8 x, y;
  for (int64_t j = 0; j < ROW; j += 16) {
    const unsigned char* b = q + j * 4;
    _mm_prefetch(reinterpret_cast<const char*>(b + PREFETCH_BYTES), _MM_HINT_T0);
    x.add(b, sw.lo + j, sw.hi + j);
    y.add(b + 32, sw.lo + j + 8, sw.hi + j + 8);
  }
  return int64_t(x.total() + y.total());
#elif defined(RB_AVX512)
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  for (int64_t j = 0; j < ROW; j += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(q + j * 4 + PREFETCH_BYTES), _MM_HINT_T0);
    fp16(_mm512_loadu_si512(q + j * 4), w + j, a0, a1);
  }
  return fp_total(a0, a1);
#else
  uint64_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t j = 0; j < ROW; j += 8) {
    for (int k = 0; k < 8; ++k) {
      int32_t lane = load<int32_t>(q + (j + k) * 4);
      acc[k] += uint64_t(int64_t(lane)) * w[j + k];
    }
  }
  uint64_t s = 0;
  for (int k = 0; k < 8; ++k) s += acc[k];
  return int64_t(s);
#endif
}

// The row sum of the last, partial row: `nbytes` bytes (not a multiple of ROW*4), zero-padded.
int64_t tail_row_sum(const unsigned char* p, int64_t nbytes, const uint64_t* w) {
  uint64_t s = 0;
  int64_t lanes = nbytes / 4;
  for (int64_t j = 0; j < lanes; ++j) s += uint64_t(int64_t(load<int32_t>(p + j * 4))) * w[j];
  int64_t rest = nbytes - lanes * 4;
  if (rest) {
    unsigned char buf[4] = {0, 0, 0, 0};
    std::memcpy(buf, p + lanes * 4, rest);
    s += uint64_t(int64_t(load<int32_t>(buf))) * w[lanes];
  }
  return int64_t(s);
}

// One element as the type min/max are kept in (float for <= 32-bit floats, else double).
template <typename T, int DT>
inline auto value(const unsigned char* p, int64_t i) {
  if constexpr (DT == BF16) {
    return bf16_to_f32(load<uint16_t>(p + i * 2));
  } else if constexpr (DT == F16) {
    return f16_to_f32(load<uint16_t>(p + i * 2));
  } else if constexpr (DT == F32) {
    return load<float>(p + i * 4);
  } else {
    return double(load<T>(p + i * sizeof(T)));
  }
}

// Sum and sum of squares in float64, min and max, over K interleaved accumulators carried
// across the rows of a chunk; NaN/Inf are counted afterwards, and only when the sum is not
// finite (count_nonfinite), so a clean tensor pays nothing for them.
template <typename T, int DT>
struct Acc {
  using V = decltype(value<T, DT>(nullptr, 0));
  double s[K], q[K];
  V lo[K], hi[K];

  Acc() {
    for (int k = 0; k < K; ++k) {
      s[k] = q[k] = 0;
      lo[k] = INFINITY;
      hi[k] = -INFINITY;
    }
  }

  inline void one(V v, int k) {
    double x = v;
    s[k] += x;
    q[k] += x * x;
    lo[k] = v < lo[k] ? v : lo[k];
    hi[k] = v > hi[k] ? v : hi[k];
  }

  // n elements from p; every call but the chunk's last has n % K == 0 (a whole row)
  void add(const unsigned char* p, int64_t n) {
    int64_t i = 0;
    for (; i + K <= n; i += K)
      for (int k = 0; k < K; ++k) one(value<T, DT>(p, i + k), k);
    int64_t m = n - i;  // < K
    for (int k = 0; k < m && k < K; ++k) one(value<T, DT>(p, i + k), k);
  }

#ifdef RB_AVX512
  // One whole row of a <= 32-bit float dtype: its row sum, and the same statistics as add()
  // (accumulator k takes the elements i with i % K == k, in order), from one read of the row.
  int64_t fused_row(const unsigned char* q, const uint64_t* w) {
    static_assert(K == 16, "the vector layout below is for 16 accumulators");
    __m512d s0 = _mm512_loadu_pd(s), s1 = _mm512_loadu_pd(s + 8);
    __m512d q0 = _mm512_loadu_pd(this->q), q1 = _mm512_loadu_pd(this->q + 8);
    __m512 l = _mm512_loadu_ps(lo), h = _mm512_loadu_ps(hi);
    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
    auto st16 = [&](__m512 f) {
      __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
      __m512d d1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
      s0 = _mm512_add_pd(s0, d0);
      s1 = _mm512_add_pd(s1, d1);
      q0 = _mm512_add_pd(q0, _mm512_mul_pd(d0, d0));
      q1 = _mm512_add_pd(q1, _mm512_mul_pd(d1, d1));
      l = _mm512_min_ps(f, l);  // f < l ? f : l, as one() (NaN keeps l)
      h = _mm512_max_ps(f, h);
    };
    for (int64_t j = 0; j < ROW; j += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(q + j * 4 + PREFETCH_BYTES), _MM_HINT_T0);
      __m512i v = _mm512_loadu_si512(q + j * 4);
      fp16(v, w + j, a0, a1);
      if constexpr (DT == F32) {
        st16(_mm512_castsi512_ps(v));
      } else if constexpr (DT == BF16) {
        st16(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16)));
        st16(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16)));
      } else {
        st16(_mm512_cvtph_ps(_mm512_castsi512_si256(v)));
        st16(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1)));
      }
    }
    _mm512_storeu_pd(s, s0);
    _mm512_storeu_pd(s + 8, s1);
    _mm512_storeu_pd(this->q, q0);
    _mm512_storeu_pd(this->q + 8, q1);
    _mm512_storeu_ps(lo, l);
    _mm512_storeu_ps(hi, h);
    return fp_total(a0, a1);
  }
#endif

#ifdef RB_AVX2
  // The AVX2 twin of the above: accumulator k takes the elements i with i % K == k, in order.
  int64_t fused_row(const unsigned char* q, const uint64_t* w) {
    static_assert(K == 16, "the vector layout below is for 16 accumulators");
    __m256d sv[4], qv[4];
    for (int k = 0; k < 4; ++k) {
      sv[k] = _mm256_loadu_pd(s + 4 * k);
      qv[k] = _mm256_loadu_pd(this->q + 4 * k);
    }
    __m256 l0 = _mm256_loadu_ps(lo), l1 = _mm256_loadu_ps(lo + 8);
    __m256 h0 = _mm256_loadu_ps(hi), h1 = _mm256_loadu_ps(hi + 8);
    const SplitWeights& sw = split(w);
    Fp8 x, y;
    auto st8 = [&](__m256 f, int half) {  // elements 8*half .. 8*half+7 of a group of 16
      __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
      __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
      sv[2 * half] = _mm256_add_pd(sv[2 * half], d0);
      sv[2 * half + 1] = _mm256_add_pd(sv[2 * half + 1], d1);
      qv[2 * half] = _mm256_add_pd(qv[2 * half], _mm256_mul_pd(d0, d0));
      qv[2 * half + 1] = _mm256_add_pd(qv[2 * half + 1], _mm256_mul_pd(d1, d1));
      if (half == 0) {
        l0 = _mm256_min_ps(f, l0);  // f < l ? f : l, as one() (NaN keeps l)
        h0 = _mm256_max_ps(f, h0);
      } else {
        l1 = _mm256_min_ps(f, l1);
        h1 = _mm256_max_ps(f, h1);
      }
    };
    auto widen_bf16 = [](__m128i h) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    };
    for (int64_t j = 0; j < ROW; j += 16) {  // 64 bytes: 16 lanes
      const unsigned char* b = q + j * 4;
      _mm_prefetch(reinterpret_cast<const char*>(b + PREFETCH_BYTES), _MM_HINT_T0);
      x.add(b, sw.lo + j, sw.hi + j);
      y.add(b + 32, sw.lo + j + 8, sw.hi + j + 8);
      if constexpr (DT == F32) {
        st8(_mm256_loadu_ps(reinterpret_cast<const float*>(b)), 0);
        st8(_mm256_loadu_ps(reinterpret_cast<const float*>(b + 32)), 1);
      } else {  // 32 half-width elements: two groups of 16
        for (int g = 0; g < 2; ++g) {
          __m128i e0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 32 * g));
          __m128i e1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 32 * g + 16));
          if constexpr (DT == BF16) {
            st8(widen_bf16(e0), 0);
            st8(widen_bf16(e1), 1);
          } else {
            st8(_mm256_cvtph_ps(e0), 0);
            st8(_mm256_cvtph_ps(e1), 1);
          }
        }
      }
    }
    for (int k = 0; k < 4; ++k) {
      _mm256_storeu_pd(s + 4 * k, sv[k]);
      _mm256_storeu_pd(this->q + 4 * k, qv[k]);
    }
    _mm256_storeu_ps(lo, l0);
    _mm256_storeu_ps(lo + 8, l1);
    _mm256_storeu_ps(hi, h0);
    _mm256_storeu_ps(hi + 8, h1);
    return int64_t(x.total() + y.total());
  }
#endif

  Partial result() const {
    Partial r;
    for (int k = 0; k < K; ++k) {
      r.sum += s[k];
      r.sq += q[k];
      r.mn = lo[k] < r.mn ? double(lo[k]) : r.mn;
      r.mx = hi[k] > r.mx ? double(hi[k]) : r.mx;
    }
    return r;
  }
};

// One chunk, row by row: each row's sum, then its statistics while its 16 KiB are in L1.
template <typename T, int DT, bool STATS>
void chunk(const unsigned char* p, int64_t len, const uint64_t* w, int64_t* row_out, Partial* part) {
  Acc<T, DT> acc;
  int64_t full = len / (ROW * 4);
  for (int64_t r = 0; r < full; ++r) {
    const unsigned char* q = p + r * ROW * 4;
#if defined(RB_AVX512) || defined(RB_AVX2)
    if constexpr (STATS && (DT == F32 || DT == BF16 || DT == F16)) {
      row_out[r] = acc.fused_row(q, w);
      continue;
    }
#endif
    row_out[r] = row_sum(q, w);
    if constexpr (STATS) acc.add(q, ROW * 4 / int64_t(sizeof(T)));
  }
  int64_t rest = len - full * ROW * 4;
  if (rest) {
    row_out[full] = tail_row_sum(p + full * ROW * 4, rest, w);
    if constexpr (STATS) acc.add(p + full * ROW * 4, rest / int64_t(sizeof(T)));
  }
  if constexpr (STATS) *part = acc.result();
}

template <typename T, int DT>
void count_range(const unsigned char* p, int64_t n, int64_t* nan, int64_t* inf) {
  for (int64_t i = 0; i < n; ++i) {
    double x = value<T, DT>(p, i);
    *nan += x != x;
    *inf += std::fabs(x) == INFINITY;
  }
}

int element_size(int dtype) {
  switch (dtype) {
    case F32: case I32: case U32: return 4;
    case F64: case I64: case U64: return 8;
    case BF16: case F16: case I16: case U16: return 2;
    case I8: case U8: case BOOL: return 1;
    default: return 0;
  }
}

void do_chunk(const unsigned char* p, int64_t len, int dtype, const uint64_t* w, int64_t* row_out, Partial* part) {
  switch (dtype) {
    case F32: return chunk<float, F32, true>(p, len, w, row_out, part);
    case F64: return chunk<double, F64, true>(p, len, w, row_out, part);
    case BF16: return chunk<uint16_t, BF16, true>(p, len, w, row_out, part);
    case F16: return chunk<uint16_t, F16, true>(p, len, w, row_out, part);
    case I64: return chunk<int64_t, I64, true>(p, len, w, row_out, part);
    case I32: return chunk<int32_t, I32, true>(p, len, w, row_out, part);
    case I16: return chunk<int16_t, I16, true>(p, len, w, row_out, part);
    case I8: return chunk<int8_t, I8, true>(p, len, w, row_out, part);
    case U8: case BOOL: return chunk<uint8_t, U8, true>(p, len, w, row_out, part);
    case U16: return chunk<uint16_t, U16, true>(p, len, w, row_out, part);
    case U32: return chunk<uint32_t, U32, true>(p, len, w, row_out, part);
    case U64: return chunk<uint64_t, U64, true>(p, len, w, row_out, part);
    default: return chunk<uint8_t, U8, false>(p, len, w, row_out, part);
  }
}

void count_nonfinite(const unsigned char* p, int64_t n, int dtype, int64_t* nan, int64_t* inf) {
  switch (dtype) {
    case F32: return count_range<float, F32>(p, n, nan, inf);
    case F64: return count_range<double, F64>(p, n, nan, inf);
    case BF16: return count_range<uint16_t, BF16>(p, n, nan, inf);
    case F16: return count_range<uint16_t, F16>(p, n, nan, inf);
    default: return;  // integers are always finite
  }
}






// The sum of squares alone (a sentinel step's gradient norms, taken in the backward pass
// while each gradient is still in cache): exactly the float64 value the statistics above
// give for the same bytes. Element i of a chunk goes to accumulator i % K, as in Acc, and
// the accumulators and then the chunks are added in the same order; only the other
// statistics and the row sums are left out.
template <typename T, int DT>
double sumsq_chunk(const unsigned char* p, int64_t n) {
  static_assert(K == 16, "the vector layouts below are for 16 accumulators");
  double q[K];
  for (int k = 0; k < K; ++k) q[k] = 0;
  int64_t i = 0;
#if defined(RB_AVX512)
  if constexpr (DT == F32 || DT == BF16 || DT == F16 || DT == F64) {
    __m512d q0 = _mm512_setzero_pd(), q1 = _mm512_setzero_pd();
    for (; i + K <= n; i += K) {
      __m512d d0, d1;
      if constexpr (DT == F64) {
        d0 = _mm512_loadu_pd(reinterpret_cast<const double*>(p) + i);
        d1 = _mm512_loadu_pd(reinterpret_cast<const double*>(p) + i + 8);
      } else {
        __m512 f;
        if constexpr (DT == F32) {
          f = _mm512_loadu_ps(reinterpret_cast<const float*>(p) + i);
        } else {
          __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i));
          if constexpr (DT == BF16) {
            f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
          } else {
            f = _mm512_cvtph_ps(h);
          }
        }
        d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
        d1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
      }
      q0 = _mm512_add_pd(q0, _mm512_mul_pd(d0, d0));
      q1 = _mm512_add_pd(q1, _mm512_mul_pd(d1, d1));
    }
    _mm512_storeu_pd(q, q0);
    _mm512_storeu_pd(q + 8, q1);
  }
#elif defined(RB_AVX2)
  if constexpr (DT == F32 || DT == BF16 || DT == F16 || DT == F64) {
    __m256d qv[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    auto widen = [&](__m128i h) {
      if constexpr (DT == BF16) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      } else {
        return _mm256_cvtph_ps(h);
      }
    };
    for (; i + K <= n; i += K) {
      __m256d d[4];
      if constexpr (DT == F64) {
        for (int k = 0; k < 4; ++k) d[k] = _mm256_loadu_pd(reinterpret_cast<const double*>(p) + i + 4 * k);
      } else {
        __m256 f[2];
        if constexpr (DT == F32) {
          f[0] = _mm256_loadu_ps(reinterpret_cast<const float*>(p) + i);
          f[1] = _mm256_loadu_ps(reinterpret_cast<const float*>(p) + i + 8);
        } else {
          f[0] = widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i)));
          f[1] = widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i + 16)));
        }
        for (int h = 0; h < 2; ++h) {
          d[2 * h] = _mm256_cvtps_pd(_mm256_castps256_ps128(f[h]));
          d[2 * h + 1] = _mm256_cvtps_pd(_mm256_extractf128_ps(f[h], 1));
        }
      }
      for (int k = 0; k < 4; ++k) qv[k] = _mm256_add_pd(qv[k], _mm256_mul_pd(d[k], d[k]));
    }
    for (int k = 0; k < 4; ++k) _mm256_storeu_pd(q + 4 * k, qv[k]);
  }
#endif
  for (; i < n; ++i) {
    double x = value<T, DT>(p, i);
    q[i % K] += x * x;
  }
  double r = 0;
  for (int k = 0; k < K; ++k) r += q[k];
  return r;
}

template <typename T, int DT>
double sumsq(const unsigned char* p, int64_t nbytes) {
  double r = 0;
  for (int64_t begin = 0; begin < nbytes; begin += CHUNK_BYTES) {
    int64_t len = nbytes - begin < CHUNK_BYTES ? nbytes - begin : CHUNK_BYTES;
    r += sumsq_chunk<T, DT>(p + begin, len / int64_t(sizeof(T)));
  }
  return r;
}

// Where a chunk's bytes come from: the tensor itself when it is contiguous, else gathered,
// in logical (row-major) order, into a cache-sized buffer: the same bytes a contiguous copy
// would hold, without allocating that copy.
struct Source {
  const unsigned char* base;
  int64_t nbytes;
  // strided only (nd > 0): element size, and shape and strides (in elements) per dim
  int64_t es = 0;
  int nd = 0;
  const int64_t* shape = nullptr;
  const int64_t* stride = nullptr;
  unsigned char* buf = nullptr;

  const unsigned char* get(int64_t begin, int64_t len) const {
    if (nd == 0) return base + begin;
    int64_t e = begin / es, end = (begin + len) / es;
    int64_t idx[MAX_DIMS];
    int64_t rest = e;
    for (int d = nd - 1; d >= 0; --d) {
      idx[d] = rest % shape[d];
      rest /= shape[d];
    }
    unsigned char* out = buf;
    const int64_t inner = shape[nd - 1], inner_stride = stride[nd - 1];
    while (e < end) {
      int64_t off = 0;
      for (int d = 0; d < nd; ++d) off += idx[d] * stride[d];
      int64_t run = inner - idx[nd - 1];
      if (run > end - e) run = end - e;
      const unsigned char* src = base + off * es;
      if (inner_stride == 1) {
        std::memcpy(out, src, run * es);
      } else {
        for (int64_t k = 0; k < run; ++k) std::memcpy(out + k * es, src + k * inner_stride * es, es);
      }
      out += run * es;
      e += run;
      idx[nd - 1] += run;
      for (int d = nd - 1; d > 0 && idx[d] == shape[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
    return buf;
  }
};

int run(const Source& src, int dtype, const int64_t* weights, int64_t* row_out, double* stats_out, int64_t* counts_out) {
  if (dtype != NONE && element_size(dtype) == 0) return -1;
  const uint64_t* w = reinterpret_cast<const uint64_t*>(weights);
  const int64_t nbytes = src.nbytes;
  Partial r;
  for (int64_t begin = 0; begin < nbytes; begin += CHUNK_BYTES) {
    int64_t len = nbytes - begin < CHUNK_BYTES ? nbytes - begin : CHUNK_BYTES;
    Partial part;
    do_chunk(src.get(begin, len), len, dtype, w, row_out + begin / (ROW * 4), &part);
    r.sum += part.sum;
    r.sq += part.sq;
    r.mn = part.mn < r.mn ? part.mn : r.mn;
    r.mx = part.mx > r.mx ? part.mx : r.mx;
  }
  if (dtype != NONE) {
    stats_out[0] = r.sum;
    stats_out[1] = r.sq;
    stats_out[2] = r.mn;
    stats_out[3] = r.mx;
    counts_out[0] = counts_out[1] = 0;
    if (!std::isfinite(r.sum) || !std::isfinite(r.sq)) {
      const int es = element_size(dtype);
      for (int64_t begin = 0; begin < nbytes; begin += CHUNK_BYTES) {
        int64_t len = nbytes - begin < CHUNK_BYTES ? nbytes - begin : CHUNK_BYTES;
        count_nonfinite(src.get(begin, len), len / es, dtype, &counts_out[0], &counts_out[1]);
      }
      if (counts_out[0]) stats_out[0] = stats_out[1] = stats_out[2] = stats_out[3] = NAN;
    }
  }
  return 0;
}

}  // namespace

extern "C" {

int rb_abi_version() { return 4; }

// data/nbytes: the tensor's contiguous bytes. dtype: a Dtype code (NONE: row sums only).
// weights: ROW odd 64-bit column weights. row_out: ceil(nbytes / (ROW*4)) slots.
// stats_out: [sum, sum of squares, min, max]; counts_out: [nan, inf] (counted only when the
// sum is not finite; with a NaN the four statistics are NaN, as NumPy's).
// Returns 0, or -1 for a dtype code it does not know.
// Single-threaded on purpose: called between a training step's ops, helper threads (spawned
// per call, or parked between calls) fought the framework's own and measured slower in situ.
int rb_fingerprint_stats(const void* data, int64_t nbytes, int dtype, const int64_t* weights, int64_t* row_out,
                         double* stats_out, int64_t* counts_out) {
  return run(Source{static_cast<const unsigned char*>(data), nbytes}, dtype, weights, row_out, stats_out, counts_out);
}

// rb_fingerprint_stats for n contiguous tensors in one call (a step's parameters and
// optimizer state: the per-call cost from Python is most of a small tensor's cost). items:
// n rows of (data address, nbytes, dtype code, index of the tensor's first row in row_out);
// stats_out: 4 per tensor, counts_out: 2 per tensor. Returns 0, or the first failing
// tensor's code.
int rb_fingerprint_stats_many(int64_t n, const int64_t* items, const int64_t* weights, int64_t* row_out,
                              double* stats_out, int64_t* counts_out) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* it = items + 4 * i;
    int rc = run(Source{reinterpret_cast<const unsigned char*>(it[0]), it[1]}, int(it[2]), weights, row_out + it[3],
                 stats_out + 4 * i, counts_out + 2 * i);
    if (rc != 0) return rc;
  }
  return 0;
}

// The same for a strided tensor: data points at its first element; es is the element size
// (1, 2, 4 or 8); shape and strides (in elements, >= 0) have nd <=
// MAX_DIMS entries. Gives exactly what rb_fingerprint_stats gives for a contiguous copy.
// Returns -2 for an nd it cannot take, or an element size that does not divide CHUNK_BYTES.
int rb_fingerprint_stats_strided(const void* data, int64_t es, int nd, const int64_t* shape, const int64_t* strides,
                                 int dtype, const int64_t* weights, int64_t* row_out, double* stats_out,
                                 int64_t* counts_out) {
  if (nd < 1 || nd > MAX_DIMS || es < 1 || CHUNK_BYTES % es) return -2;
  if (dtype != NONE && element_size(dtype) != es) return -1;
  int64_t numel = 1;
  for (int d = 0; d < nd; ++d) numel *= shape[d];
  static thread_local std::vector<unsigned char> buf;
  if (buf.size() < size_t(CHUNK_BYTES)) buf.resize(CHUNK_BYTES);
  Source src{static_cast<const unsigned char*>(data), numel * es, es, nd, shape, strides, buf.data()};
  return run(src, dtype, weights, row_out, stats_out, counts_out);
}

// The sum of squares of a contiguous float32, float64, bfloat16 or float16 tensor, into
// *out: the same bits as the sum of squares rb_fingerprint_stats gives (NaN when one
// element is NaN). Returns 0, or -1 for another dtype code or a size that is not whole elements.
int rb_sumsq(const void* data, int64_t nbytes, int dtype, double* out) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  const int es = element_size(dtype);
  if (es == 0 || nbytes % es) return -1;
  switch (dtype) {
    case F32: *out = sumsq<float, F32>(p, nbytes); return 0;
    case F64: *out = sumsq<double, F64>(p, nbytes); return 0;
    case BF16: *out = sumsq<uint16_t, BF16>(p, nbytes); return 0;
    case F16: *out = sumsq<uint16_t, F16>(p, nbytes); return 0;
    default: return -1;
  }
}

}  // extern "C"
