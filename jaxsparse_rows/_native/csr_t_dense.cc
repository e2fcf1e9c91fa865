// Native CPU kernel for `jsr.dot(csr, dense, transpose_a=True)`, registered
// with XLA through the typed FFI; see jaxsparse_rows/_native/__init__.py.
//
// The result is row-sparse: its rows are the distinct valid column ids of the
// CSR, sorted, padded with K to the static capacity C = min(nse, K), and
//   data[u, :] = sum over slots j with cols[j] == indices[u] (in slot order) of
//                vals[j] * table[rows[j], :]
// where rows[j] is slot j's row id (M for padding); a row id outside the table
// reads a zero row. This is exactly what the XLA path computes (gather, scale,
// sort-based coalesce), without its [nse, D] temporary: a stable LSD radix
// sort of (column, row, value) entries, then one pass per distinct column,
// the result rows split over XLA's intra-op pool. Every index read from the
// inputs is range-checked.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "dispatch.h"
#include "parallel.h"
#include "radix.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPrefetchAhead = 8;        // entries ahead whose table row is prefetched
constexpr int64_t kMaxPrefetchBytes = 1024;  // of each such row
constexpr size_t kHugePageMin = size_t{4} << 20;
constexpr int64_t kParallelMinWork = 1 << 16;  // multiply-adds and zeroed values

template <typename T, typename I>
struct Entry {
  I col;
  I row;
  T val;
};

// The valid entries (column in [0, k)) as (column, row, value), stably sorted
// by column with an LSD radix sort: slot order is kept within a column, and
// everything the accumulation reads except the table rows is sequential.
template <typename T, typename I>
std::vector<Entry<T, I>> SortedEntries(const T* vals, const I* cols, const I* rows, int64_t nse,
                                       int64_t k) {
  std::vector<Entry<T, I>> a;
  a.reserve(nse);
  for (int64_t j = 0; j < nse; ++j) {
    if (cols[j] >= 0 && cols[j] < k) a.push_back({cols[j], rows[j], vals[j]});
  }
  std::vector<Entry<T, I>> scratch;
  jaxsparse_rows::RadixSort(a, scratch, jaxsparse_rows::KeyBits(k),
                            [](const Entry<T, I>& e) { return e.col; });
  return a;
}

// Asks the kernel for transparent huge pages on a large output that XLA just
// allocated and nobody has touched yet (numpy does the same for its arrays):
// a fresh 256 MB buffer otherwise costs 65,536 page faults when first written.
void AdviseHugePages(void* ptr, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes < kHugePageMin) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  const uintptr_t lo = (a + 4095) & ~uintptr_t{4095};
  const uintptr_t hi = (a + bytes) & ~uintptr_t{4095};
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)ptr;
  (void)bytes;
#endif
}

template <typename T, typename I>
ffi::Error Run(ffi::ThreadPool& pool, ffi::AnyBuffer vals_b, ffi::AnyBuffer cols_b,
               ffi::AnyBuffer rows_b,
               ffi::AnyBuffer table_b, int64_t k, ffi::Result<ffi::AnyBuffer> idx_b,
               ffi::Result<ffi::AnyBuffer> data_b) {
  const int64_t nse = static_cast<int64_t>(vals_b.element_count());
  const auto tdims = table_b.dimensions();
  if (tdims.size() < 1) return ffi::Error::InvalidArgument("table must have a row axis");
  const int64_t t_rows = tdims[0];
  int64_t d = 1;
  for (size_t i = 1; i < tdims.size(); ++i) d *= tdims[i];
  const int64_t cap = static_cast<int64_t>(idx_b->element_count());
  if (static_cast<int64_t>(data_b->element_count()) != cap * d ||
      static_cast<int64_t>(cols_b.element_count()) != nse ||
      static_cast<int64_t>(rows_b.element_count()) != nse) {
    return ffi::Error::InvalidArgument("operand sizes do not match");
  }
  if (k < 0 || k > static_cast<int64_t>(std::numeric_limits<I>::max())) {
    return ffi::Error::InvalidArgument("k must fit the index dtype (it pads the indices)");
  }
  const T* table = table_b.typed_data<T>();
  I* idx = idx_b->typed_data<I>();
  T* data = data_b->typed_data<T>();
  AdviseHugePages(data, sizeof(T) * cap * d);

  const auto entries = SortedEntries(vals_b.typed_data<T>(), cols_b.typed_data<I>(),
                                     rows_b.typed_data<I>(), nse, k);
  const int64_t n_entries = static_cast<int64_t>(entries.size());
  // Where each distinct column's run of entries starts (and one past the end).
  std::vector<int64_t> starts;
  for (int64_t n = 0; n < n_entries; ++n) {
    if (n == 0 || entries[n].col != entries[n - 1].col) starts.push_back(n);
  }
  const int64_t n_unique = static_cast<int64_t>(starts.size());
  if (n_unique > cap) {  // cannot happen when cap = min(nse, k): never drop silently
    return ffi::Error::InvalidArgument("more distinct columns than result slots");
  }
  starts.push_back(n_entries);

  const int64_t row_bytes = std::min<int64_t>(d * static_cast<int64_t>(sizeof(T)),
                                              kMaxPrefetchBytes);
  // Result slot u < n_unique sums its column's entries in slot order; the
  // slots after those are padding (id k, zero row). Slots are split over
  // threads, each written by exactly one.
  auto fill = [&](int64_t u0, int64_t u1) {
    const int64_t last = std::min(u1, n_unique);
    for (int64_t u = u0; u < last; ++u) {
      T* __restrict__ o = data + u * d;
      std::memset(o, 0, sizeof(T) * d);
      idx[u] = entries[starts[u]].col;
      for (int64_t n = starts[u]; n < starts[u + 1]; ++n) {
        if (n + kPrefetchAhead < n_entries) {
          const int64_t r = entries[n + kPrefetchAhead].row;
          if (r >= 0 && r < t_rows) {
            const char* row = reinterpret_cast<const char*>(table + r * d);
            for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(row + b);
          }
        }
        const T v = entries[n].val;
        const int64_t r = entries[n].row;
        if (r < 0 || r >= t_rows) {
          if (!std::isfinite(v)) {  // v times a zero row
            for (int64_t t = 0; t < d; ++t) o[t] += v * T(0);
          }
          continue;
        }
        const T* __restrict__ row = table + r * d;
        for (int64_t t = 0; t < d; ++t) o[t] += v * row[t];
      }
    }
    const int64_t pad0 = std::max(u0, n_unique);
    for (int64_t u = pad0; u < u1; ++u) idx[u] = static_cast<I>(k);
    if (u1 > pad0) std::memset(data + pad0 * d, 0, sizeof(T) * d * (u1 - pad0));
  };
  jaxsparse_rows::ParallelRanges(pool, cap, (n_entries + cap) * d >= kParallelMinWork, fill);
  return ffi::Error::Success();
}

ffi::Error CsrTDense(ffi::ThreadPool pool, ffi::AnyBuffer vals, ffi::AnyBuffer cols,
                     ffi::AnyBuffer rows,
                     ffi::AnyBuffer table, int64_t k, ffi::Result<ffi::AnyBuffer> idx,
                     ffi::Result<ffi::AnyBuffer> data) {
  const auto vt = vals.element_type();
  const auto it = cols.element_type();
  if (table.element_type() != vt || data->element_type() != vt ||
      rows.element_type() != it || idx->element_type() != it) {
    return ffi::Error::InvalidArgument("operand dtypes do not match");
  }
  return jaxsparse_rows::ForDtypes(vt, it, [&](auto t, auto i) {
    return Run<decltype(t), decltype(i)>(pool, vals, cols, rows, table, k, idx, data);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jsr_csr_t_dense, CsrTDense,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // vals [nse]
                                  .Arg<ffi::AnyBuffer>()  // cols [nse]
                                  .Arg<ffi::AnyBuffer>()  // rows [nse]: row id into table
                                  .Arg<ffi::AnyBuffer>()  // table [T, ...]
                                  .Attr<int64_t>("k")     // number of columns K
                                  .Ret<ffi::AnyBuffer>()  // indices [C]
                                  .Ret<ffi::AnyBuffer>()  // data [C, ...]
);
