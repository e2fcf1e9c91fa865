// Native CPU kernels for the row gathers and scatters of the lazy optimizers,
// registered with XLA through the typed FFI. The XLA ops they replace
// (`x.at[ids].get / set / add` with sorted unique ids) stay the reference, the
// GPU path and the fallback; see jaxsparse_rows/_native/__init__.py.
//
//   gather:   out[i, :] = table[ids[i], :]   (a zero row for ids outside [0, N))
//   scatter:  table[ids[i], :] = rows[i, :]  (or +=; ids outside [0, N) dropped)
//   sum rows: out = zeros[N, ...]; out[ids[i], :] += rows[i, :]  (any order,
//             repeats summed, ids outside [0, N) dropped): the gather's transpose
//
// The scatter's result is the table operand itself (XLA aliases the two, so a
// donated table is updated in place). Both loops are bound by the latency of
// reaching random rows of a large table, so they prefetch the rows a few ids
// ahead (rows of a cache line or more; narrower ones move with fixed-width
// loops instead) and split the ids over XLA's intra-op thread pool. Every id is
// range-checked: malformed ids give unspecified values, never an
// out-of-bounds access.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "dispatch.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPrefetchAhead = 8;          // ids ahead whose row is prefetched
constexpr int64_t kMaxPrefetchBytes = 1024;    // of each such row (the rest streams in)
constexpr int64_t kParallelMinBytes = 1 << 17; // moved bytes below which one thread is faster

// PrefetchRow and Rows::Row are always inlined: without that, GCC 12 at -O3
// compiled the scatter loops with no prefetch at all (the gather kept its
// own), and the in-place add ran about 1.7x slower than XLA's scatter.
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
  // fixed width is), at most kMaxPrefetchBytes (the rest streams in).
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

// Splits [0, k) over the pool. Each range is moved to start and end where a
// run of one in-range id starts (RunStart is monotonic, so the moved ranges
// stay disjoint and still cover [0, k)): malformed repeated sorted ids never
// make two threads write one row, and the padding tail (the out-of-range id
// N, repeated) still splits freely.
template <typename I, typename Body>
void ForIds(ffi::ThreadPool& pool, const Rows<I>& r, Body body, bool may_split = true) {
  jaxsparse_rows::ParallelRanges(
      pool, r.k, may_split && r.k * r.row_bytes >= kParallelMinBytes,
      [&r, &body](int64_t b, int64_t e) {
        b = RunStart(r, b);
        e = RunStart(r, e);
        if (b < e) body(b, e);
      });
}

// True when every repeat of an in-range id directly follows the same id, as in
// a RowSparse's sorted ids (ids outside [0, N) are dropped and may sit
// anywhere). Only then can ForIds split a scatter's ids over threads: ids
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

template <typename I>
ffi::Error GatherT(ffi::ThreadPool& pool, ffi::AnyBuffer table, ffi::AnyBuffer ids,
                   ffi::Result<ffi::AnyBuffer> out) {
  const Rows<I> r = MakeRows<I>(table.untyped_data(), table.dimensions(),
                                ffi::ByteWidth(table.element_type()), ids);
  if (static_cast<int64_t>(out->size_bytes()) != r.k * r.row_bytes) {
    return ffi::Error::InvalidArgument("gather: output size does not match [K, ...]");
  }
  char* o = static_cast<char*>(out->untyped_data());
  ForRowWidth(r.row_bytes, [&](auto width) {
    constexpr int64_t R = decltype(width)::value;
    const int64_t ahead = r.template PrefetchBytes<R>();
    ForIds(pool, r, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const char* src = r.Row(i, ahead, false);
        if (src) {
          CopyRow<R>(o + i * r.row_bytes, src, r.row_bytes);
        } else {
          std::memset(o + i * r.row_bytes, 0, r.row_bytes);
        }
      }
    });
  });
  return ffi::Error::Success();
}

// Adds rows[i] into the table's row ids[i] for i in [b, e), rows of R bytes
// (R == 0: r.row_bytes).
template <typename T, int64_t R, typename I>
void AddRows(const Rows<I>& r, const T* __restrict__ rows, int64_t b, int64_t e) {
  const int64_t d = RowElems<T, R>(r.row_bytes);
  const int64_t ahead = r.template PrefetchBytes<R>();
  for (int64_t i = b; i < e; ++i) {
    T* __restrict__ dst = reinterpret_cast<T*>(const_cast<char*>(r.Row(i, ahead, true)));
    if (!dst) continue;
    const T* __restrict__ src = rows + i * d;
    for (int64_t t = 0; t < d; ++t) dst[t] += src[t];
  }
}

template <typename I>
ffi::Error ScatterT(ffi::ThreadPool& pool, ffi::AnyBuffer table, ffi::AnyBuffer ids,
                    ffi::AnyBuffer rows, ffi::Result<ffi::AnyBuffer> out, bool add) {
  // XLA aliases `out` with `table`; copy only if it ever did not.
  if (out->untyped_data() != table.untyped_data()) {
    std::memcpy(out->untyped_data(), table.untyped_data(), table.size_bytes());
  }
  const Rows<I> r =
      MakeRows<I>(out->untyped_data(), table.dimensions(), ffi::ByteWidth(table.element_type()), ids);
  if (static_cast<int64_t>(rows.size_bytes()) != r.k * r.row_bytes) {
    return ffi::Error::InvalidArgument("scatter: rows do not match [K, ...] of the table");
  }
  const char* src = static_cast<const char*>(rows.untyped_data());
  // Unsorted ids run on one thread, in id order (as XLA's scatter does).
  const bool may_split = r.k * r.row_bytes >= kParallelMinBytes && RepeatsAdjacent(r);
  if (!add) {
    ForRowWidth(r.row_bytes, [&](auto width) {
      constexpr int64_t R = decltype(width)::value;
      const int64_t ahead = r.template PrefetchBytes<R>();
      ForIds(
          pool, r,
          [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
              char* dst = const_cast<char*>(r.Row(i, ahead, true));
              if (dst) CopyRow<R>(dst, src + i * r.row_bytes, r.row_bytes);
            }
          },
          may_split);
    });
    return ffi::Error::Success();
  }
  // Addition needs the value type; the id type was chosen by the caller.
  return jaxsparse_rows::ForDtypes(table.element_type(), ids.element_type(), [&](auto t, auto) {
    using T = decltype(t);
    ForRowWidth(r.row_bytes, [&](auto width) {
      // Widths that hold no whole T (1 or 2 bytes of float) cannot occur;
      // they share the run-time loop rather than compile their own.
      constexpr int64_t R = decltype(width)::value % sizeof(T) == 0 ? decltype(width)::value : 0;
      ForIds(
          pool, r,
          [&](int64_t b, int64_t e) { AddRows<T, R, I>(r, reinterpret_cast<const T*>(src), b, e); },
          may_split);
    });
    return ffi::Error::Success();
  });
}

ffi::Error CheckOperands(ffi::AnyBuffer table, ffi::AnyBuffer ids, ffi::DataType out_type) {
  if (table.dimensions().size() < 1) return ffi::Error::InvalidArgument("table must have a row axis");
  if (out_type != table.element_type()) {
    return ffi::Error::InvalidArgument("table and result dtypes differ");
  }
  const auto it = ids.element_type();
  if (it != ffi::DataType::S32 && it != ffi::DataType::S64) {
    return ffi::Error::InvalidArgument("ids must be int32 or int64");
  }
  return ffi::Error::Success();
}

ffi::Error Gather(ffi::ThreadPool pool, ffi::AnyBuffer table, ffi::AnyBuffer ids,
                  ffi::Result<ffi::AnyBuffer> out) {
  if (auto err = CheckOperands(table, ids, out->element_type()); err.failure()) return err;
  return jaxsparse_rows::ForIdType(ids.element_type(), [&](auto i) {
    return GatherT<decltype(i)>(pool, table, ids, out);
  });
}

ffi::Error Scatter(ffi::ThreadPool pool, ffi::AnyBuffer table, ffi::AnyBuffer ids,
                   ffi::AnyBuffer rows, ffi::Result<ffi::AnyBuffer> out, bool add) {
  if (auto err = CheckOperands(table, ids, out->element_type()); err.failure()) return err;
  if (rows.element_type() != table.element_type()) {
    return ffi::Error::InvalidArgument("table and rows dtypes differ");
  }
  return jaxsparse_rows::ForIdType(ids.element_type(), [&](auto i) {
    return ScatterT<decltype(i)>(pool, table, ids, rows, out, add);
  });
}

// Zeroes `bytes` at `p` in pieces small enough that memset keeps them in the
// cache: above a size near the cache's, glibc's memset switches to
// non-temporal stores, and the sum of rows that follows then missed the cache
// on every row it added into.
inline void ZeroCached(char* p, int64_t bytes) {
  constexpr int64_t kPiece = 1 << 16;
  for (int64_t b = 0; b < bytes; b += kPiece) std::memset(p + b, 0, std::min(kPiece, bytes - b));
}

// Sums rows[i] into out[ids[i]] for ids in any order, repeats included. The
// output rows are zeroed in parallel row ranges; the sum then runs on the
// calling thread, in the order of the ids (the summation order within an
// output element). It used to be split by columns over the pool, each thread
// walking every id over its own cache lines of the rows: that strided read
// made it 1.3 to 4x slower than one thread, on 2 cores from D = 64 up.
template <typename T, typename I>
ffi::Error SumRowsT(ffi::ThreadPool& pool, ffi::AnyBuffer rows, ffi::AnyBuffer ids,
                    ffi::Result<ffi::AnyBuffer> out) {
  const auto dims = out->dimensions();
  Rows<I> r = MakeRows<I>(out->untyped_data(), dims, sizeof(T), ids);
  if (static_cast<int64_t>(rows.size_bytes()) != r.k * r.row_bytes) {
    return ffi::Error::InvalidArgument("sum rows: rows do not match [K, ...] of the result");
  }
  char* o = static_cast<char*>(out->untyped_data());
  jaxsparse_rows::ParallelRanges(pool, r.n, r.n * r.row_bytes >= kParallelMinBytes,
                                 [&](int64_t b, int64_t e) {
                                   ZeroCached(o + b * r.row_bytes, (e - b) * r.row_bytes);
                                 });
  const T* src = static_cast<const T*>(rows.untyped_data());
  ForRowWidth(r.row_bytes, [&](auto width) {
    constexpr int64_t R = decltype(width)::value;
    const int64_t d = RowElems<T, R>(r.row_bytes);
    // Ids in any order scatter their writes over the whole result, so even
    // rows narrower than a cache line prefetch theirs (one line).
    const int64_t ahead = std::max<int64_t>(r.PrefetchBytes(), 64);
    for (int64_t i = 0; i < r.k; ++i) {
      T* __restrict__ to = reinterpret_cast<T*>(const_cast<char*>(r.Row(i, ahead, true)));
      if (!to) continue;
      const T* __restrict__ from = src + i * d;
      for (int64_t c = 0; c < d; ++c) to[c] += from[c];
    }
  });
  return ffi::Error::Success();
}

ffi::Error SumRows(ffi::ThreadPool pool, ffi::AnyBuffer rows, ffi::AnyBuffer ids,
                   ffi::Result<ffi::AnyBuffer> out) {
  if (auto err = CheckOperands(*out, ids, rows.element_type()); err.failure()) return err;
  if (rows.dimensions().size() != out->dimensions().size() ||
      !std::equal(rows.dimensions().begin() + 1, rows.dimensions().end(),
                  out->dimensions().begin() + 1)) {
    return ffi::Error::InvalidArgument("sum rows: rows and result differ past the row axis");
  }
  return jaxsparse_rows::ForDtypes(rows.element_type(), ids.element_type(), [&](auto t, auto i) {
    return SumRowsT<decltype(t), decltype(i)>(pool, rows, ids, out);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jsr_sum_rows, SumRows,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // rows [K, ...]
                                  .Arg<ffi::AnyBuffer>()  // ids [K], any order
                                  .Ret<ffi::AnyBuffer>()  // out [N, ...]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jsr_gather_rows, Gather,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // table [N, ...]
                                  .Arg<ffi::AnyBuffer>()  // ids [K]
                                  .Ret<ffi::AnyBuffer>()  // out [K, ...]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jsr_scatter_rows, Scatter,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // table [N, ...]
                                  .Arg<ffi::AnyBuffer>()  // ids [K]
                                  .Arg<ffi::AnyBuffer>()  // rows [K, ...]
                                  .Ret<ffi::AnyBuffer>()  // the table, aliased
                                  .Attr<bool>("add"));
