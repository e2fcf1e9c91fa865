// Addressing the listed rows of a table, shared by the row kernels (rows.cc)
// and the fused optimizer kernels (rowwise_adagrad.cc): the range-checked row
// an id names, prefetching rows a few ids ahead, fixed-width row loops, and
// splitting ids over XLA's intra-op pool without two threads writing one row.
#ifndef JAXSPARSE_ROWS_NATIVE_ROWS_H_
#define JAXSPARSE_ROWS_NATIVE_ROWS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace jaxsparse_rows {

namespace ffi = xla::ffi;

constexpr int64_t kPrefetchAhead = 8;          // ids ahead whose row is prefetched
// Of each such row only the first cache line is prefetched: that starts the
// page walk and the first line early, and the rest of the row follows it in
// (the hardware's adjacent-line prefetch, out-of-order loads). Prefetching
// every line of a wide row instead is slower on tables too large for the
// caches (V = 10^7: the scatter-set about 1.2 to 1.7x the time of the
// one-line prefetch), and no faster at V = 10^4 or 10^6.
constexpr int64_t kMaxPrefetchBytes = 64;
constexpr int64_t kParallelMinBytes = 1 << 17; // moved bytes below which one thread is faster

// PrefetchRow and Rows::Row are always inlined: without that, GCC 12 at -O3
// compiles the scatter loops with no prefetch at all (the gather keeps its
// own), and the in-place add runs about 1.7x slower than XLA's scatter.
// tests/test_native_rows.py reads the built library to keep it so.
__attribute__((always_inline)) inline void PrefetchRow(const char* row, int64_t bytes, bool write) {
  if (write) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 1);
  } else {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0);
  }
}

// Rows narrower than a cache line get no software prefetch: each costs an id
// load, a range check and an instruction per row, and made the gather of
// 4-byte rows 2 to 3x slower than XLA's plain loop (the sorted ids of a
// RowSparse are what the hardware prefetcher and out-of-order loads serve
// well at that width).
constexpr int64_t kPrefetchMinRowBytes = 64;

// Row widths of 1 to 32 bytes get loops with a compile-time width (R > 0), so
// each row moves in a few register loads and stores instead of a call to
// memcpy; every other width is R == 0, a run-time width.
template <int64_t R>
using RowWidth = std::integral_constant<int64_t, R>;

template <typename F>
decltype(auto) ForRowWidth(int64_t row_bytes, F f) {
  switch (row_bytes) {
    case 1: return f(RowWidth<1>{});
    case 2: return f(RowWidth<2>{});
    case 4: return f(RowWidth<4>{});
    case 8: return f(RowWidth<8>{});
    case 16: return f(RowWidth<16>{});
    case 32: return f(RowWidth<32>{});
    default: return f(RowWidth<0>{});
  }
}

// The T elements in a row of R bytes (R > 0), or of `row_bytes` (R == 0).
template <typename T, int64_t R>
__attribute__((always_inline)) inline int64_t RowElems(int64_t row_bytes) {
  if constexpr (R > 0 && R % sizeof(T) == 0) {
    return R / static_cast<int64_t>(sizeof(T));
  } else {
    return row_bytes / static_cast<int64_t>(sizeof(T));
  }
}

// Copies one row of R bytes, or of `bytes` when R == 0.
template <int64_t R>
__attribute__((always_inline)) inline void CopyRow(char* dst, const char* src, int64_t bytes) {
  if constexpr (R > 0) {
    std::memcpy(dst, src, R);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

// The rows [n, row_bytes] of a table and the ids addressing them.
template <typename I>
struct Rows {
  char* table;
  const I* ids;
  int64_t n, k, row_bytes;

  // The row ids[i] names (nullptr outside [0, n)), prefetching `ahead_bytes`
  // of the row kPrefetchAhead ids ahead (none when ahead_bytes is 0).
  __attribute__((always_inline)) const char* Row(int64_t i, int64_t ahead_bytes, bool write) const {
    if (ahead_bytes > 0 && i + kPrefetchAhead < k) {
      const int64_t a = ids[i + kPrefetchAhead];
      if (a >= 0 && a < n) PrefetchRow(table + a * row_bytes, ahead_bytes, write);
    }
    const int64_t r = ids[i];
    return (r >= 0 && r < n) ? table + r * row_bytes : nullptr;
  }

  // The bytes of each row to prefetch ahead in a loop over rows of R bytes
  // (R == 0: `row_bytes`): 0 for rows narrower than a cache line (every
  // fixed width is), at most kMaxPrefetchBytes (the first cache line).
  template <int64_t R = 0>
  int64_t PrefetchBytes() const {
    if constexpr (R > 0) {
      return 0;
    } else {
      return row_bytes < kPrefetchMinRowBytes ? 0 : std::min(row_bytes, kMaxPrefetchBytes);
    }
  }
};

// The first position at or after x that does not continue a run of one
// in-range id (x itself unless ids[x] == ids[x-1] names a row of the table).
template <typename I>
int64_t RunStart(const Rows<I>& r, int64_t x) {
  while (x > 0 && x < r.k && r.ids[x] == r.ids[x - 1] && r.ids[x] >= 0 && r.ids[x] < r.n) ++x;
  return x;
}

// Splits [0, k) over the pool when `split` (one thread otherwise). Each range
// is moved to start and end where a run of one in-range id starts (RunStart is
// monotonic, so the moved ranges stay disjoint and still cover [0, k)):
// malformed repeated sorted ids never make two threads write one row, and the
// padding tail (the out-of-range id N, repeated) still splits freely.
template <typename I, typename Body>
void ForIds(ffi::ThreadPool& pool, const Rows<I>& r, bool split, Body body) {
  ParallelRanges(pool, r.k, split, [&r, &body](int64_t b, int64_t e) {
    b = RunStart(r, b);
    e = RunStart(r, e);
    if (b < e) body(b, e);
  });
}

// Whether a loop moving `bytes` is worth splitting over the pool.
inline bool WorthSplitting(int64_t bytes) { return bytes >= kParallelMinBytes; }

// True when every repeat of an in-range id directly follows the same id, as in
// a RowSparse's sorted ids (ids outside [0, N) are dropped and may sit
// anywhere). Only then may ForIds split a scatter's ids over threads: ids
// traced into a RowSparse under jit are not validated, and two threads adding
// into one row would lose updates. O(K) reads of the ids, against O(K x D)
// moved bytes.
template <typename I>
bool RepeatsAdjacent(const Rows<I>& r) {
  // Sorted ids (a RowSparse's, padding included) pass with one branch-free,
  // vectorized pass; the loop below, a branch per id, cost about as much as
  // XLA's whole scatter of 65,536 one-float rows.
  // Counted in blocks of 2^15 ids, so the count in the ids' own type cannot
  // wrap around to zero.
  const I* __restrict__ ids = r.ids;
  bool sorted = true;
  for (int64_t b = 1; sorted && b < r.k; b += 1 << 15) {
    const int64_t e = std::min(r.k, b + (1 << 15));
    I descents = 0;
    for (int64_t i = b; i < e; ++i) descents += ids[i - 1] > ids[i] ? 1 : 0;
    sorted = descents == 0;
  }
  if (sorted) return true;
  int64_t last = -1, last_pos = -1;
  for (int64_t i = 0; i < r.k; ++i) {
    const int64_t v = r.ids[i];
    if (v < 0 || v >= r.n) continue;
    if (v < last || (v == last && last_pos != i - 1)) return false;
    last = v;
    last_pos = i;
  }
  return true;
}

template <typename I>
Rows<I> MakeRows(const void* table, ffi::Span<const int64_t> dims, size_t elem_bytes,
                 const ffi::AnyBuffer& ids) {
  int64_t row = static_cast<int64_t>(elem_bytes);
  for (size_t i = 1; i < dims.size(); ++i) row *= dims[i];
  return Rows<I>{static_cast<char*>(const_cast<void*>(table)), ids.typed_data<I>(), dims[0],
                 static_cast<int64_t>(ids.element_count()), row};
}

}  // namespace jaxsparse_rows

#endif  // JAXSPARSE_ROWS_NATIVE_ROWS_H_
