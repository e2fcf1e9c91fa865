// Native CPU kernel for `jsr.dot(csr, dense)`, registered with XLA through the
// typed FFI. The pure-XLA path (gather rows, scale, segment-sum) stays the
// reference and the fallback; see jaxsparse_rows/_native/__init__.py.
//
// out[r, :] = sum_{j in [indptr[r], indptr[r+1])} vals[j] * table[cols[j], :]
//
// The loop is bound by the latency of fetching random table rows, so it
// prefetches the row a few entries ahead, and it splits the output rows over
// XLA's intra-op thread pool. Every index read from the inputs is range-checked:
// malformed input gives unspecified values, never an out-of-bounds access.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "dispatch.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPrefetchAhead = 4;         // entries ahead whose table row is prefetched
constexpr int64_t kMaxPrefetchBytes = 1024;   // of each such row (the rest streams in)
constexpr int64_t kParallelMinWork = 1 << 16; // multiply-adds below which one thread is faster

template <typename T, typename I>
struct Problem {
  const T* vals;
  const I* cols;
  const I* indptr;
  const T* table;
  T* out;
  int64_t nse, k, d;
};

template <typename T, typename I>
void ProductRows(const Problem<T, I>& p, int64_t r0, int64_t r1) {
  const T* __restrict__ vals = p.vals;
  const I* __restrict__ cols = p.cols;
  const int64_t row_bytes = std::min<int64_t>(p.d * static_cast<int64_t>(sizeof(T)),
                                              kMaxPrefetchBytes);
  for (int64_t r = r0; r < r1; ++r) {
    T* __restrict__ o = p.out + r * p.d;
    for (int64_t t = 0; t < p.d; ++t) o[t] = T(0);
    const int64_t s = std::clamp<int64_t>(p.indptr[r], 0, p.nse);
    const int64_t e = std::clamp<int64_t>(p.indptr[r + 1], s, p.nse);
    for (int64_t j = s; j < e; ++j) {
      if (j + kPrefetchAhead < p.nse) {  // may run into the next rows: harmless
        const int64_t c = cols[j + kPrefetchAhead];
        if (c >= 0 && c < p.k) {
          const char* row = reinterpret_cast<const char*>(p.table + c * p.d);
          for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(row + b);
        }
      }
      const int64_t c = cols[j];
      const T v = vals[j];
      if (c < 0 || c >= p.k) {
        // An id with no row reads a zero row, as the XLA path's gather does:
        // that adds nothing, except NaN when the value is not finite.
        if (!std::isfinite(v)) {
          for (int64_t t = 0; t < p.d; ++t) o[t] += v * T(0);
        }
        continue;
      }
      const T* __restrict__ row = p.table + c * p.d;
      for (int64_t t = 0; t < p.d; ++t) o[t] += v * row[t];
    }
  }
}

// ProductRows over [0, m), split over XLA's pool when there is enough work.
template <typename T, typename I>
void ProductParallel(const Problem<T, I>& p, int64_t m, ffi::ThreadPool& pool) {
  jaxsparse_rows::ParallelRanges(pool, m, p.nse * p.d >= kParallelMinWork,
                                 [p](int64_t r0, int64_t r1) { ProductRows(p, r0, r1); });
}

template <typename T, typename I>
ffi::Error Dispatch(ffi::ThreadPool& pool, ffi::AnyBuffer vals, ffi::AnyBuffer cols,
                    ffi::AnyBuffer indptr, ffi::AnyBuffer table, ffi::Result<ffi::AnyBuffer> out) {
  const int64_t m = static_cast<int64_t>(indptr.element_count()) - 1;
  if (m < 0) return ffi::Error::InvalidArgument("indptr must have at least one element");
  const auto dims = table.dimensions();
  if (dims.size() < 1) return ffi::Error::InvalidArgument("table must have a row axis");
  const int64_t k = dims[0];
  int64_t d = 1;
  for (size_t i = 1; i < dims.size(); ++i) d *= dims[i];
  if (static_cast<int64_t>(out->element_count()) != m * d) {
    return ffi::Error::InvalidArgument("output size does not match [M, D]");
  }
  if (cols.element_count() != vals.element_count()) {
    return ffi::Error::InvalidArgument("vals and cols differ in length");
  }
  Problem<T, I> p{vals.typed_data<T>(), cols.typed_data<I>(), indptr.typed_data<I>(),
                  table.typed_data<T>(), out->typed_data<T>(),
                  static_cast<int64_t>(vals.element_count()), k, d};
  ProductParallel(p, m, pool);
  return ffi::Error::Success();
}

ffi::Error CsrDense(ffi::ThreadPool pool, ffi::AnyBuffer vals, ffi::AnyBuffer cols,
                    ffi::AnyBuffer indptr, ffi::AnyBuffer table, ffi::Result<ffi::AnyBuffer> out) {
  const auto vt = vals.element_type();
  const auto it = cols.element_type();
  if (table.element_type() != vt || out->element_type() != vt || indptr.element_type() != it) {
    return ffi::Error::InvalidArgument("operand dtypes do not match");
  }
  return jaxsparse_rows::ForDtypes(vt, it, [&](auto t, auto i) {
    return Dispatch<decltype(t), decltype(i)>(pool, vals, cols, indptr, table, out);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jsr_csr_dense, CsrDense,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // vals [nse]
                                  .Arg<ffi::AnyBuffer>()  // cols [nse]
                                  .Arg<ffi::AnyBuffer>()  // indptr [M + 1]
                                  .Arg<ffi::AnyBuffer>()  // table [K, ...]
                                  .Ret<ffi::AnyBuffer>()  // out [M, ...]
);
