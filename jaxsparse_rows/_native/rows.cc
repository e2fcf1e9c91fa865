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

#include "dispatch.h"
#include "rows.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using jaxsparse_rows::CopyRow;
using jaxsparse_rows::ForIds;
using jaxsparse_rows::ForRowWidth;
using jaxsparse_rows::MakeRows;
using jaxsparse_rows::RepeatsAdjacent;
using jaxsparse_rows::RowElems;
using jaxsparse_rows::Rows;
using jaxsparse_rows::WorthSplitting;

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
    ForIds(pool, r, WorthSplitting(r.k * r.row_bytes), [&](int64_t b, int64_t e) {
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
  const bool split = WorthSplitting(r.k * r.row_bytes) && RepeatsAdjacent(r);
  if (!add) {
    ForRowWidth(r.row_bytes, [&](auto width) {
      constexpr int64_t R = decltype(width)::value;
      const int64_t ahead = r.template PrefetchBytes<R>();
      ForIds(pool, r, split, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          char* dst = const_cast<char*>(r.Row(i, ahead, true));
          if (dst) CopyRow<R>(dst, src + i * r.row_bytes, r.row_bytes);
        }
      });
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
      ForIds(pool, r, split, [&](int64_t b, int64_t e) {
        AddRows<T, R, I>(r, reinterpret_cast<const T*>(src), b, e);
      });
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
// output element). Splitting it by columns over the pool instead, each thread
// walking every id over its own cache lines of the rows, is 1.3 to 4x slower
// than one thread on 2 cores from D = 64 up (a strided read).
template <typename T, typename I>
ffi::Error SumRowsT(ffi::ThreadPool& pool, ffi::AnyBuffer rows, ffi::AnyBuffer ids,
                    ffi::Result<ffi::AnyBuffer> out) {
  const auto dims = out->dimensions();
  Rows<I> r = MakeRows<I>(out->untyped_data(), dims, sizeof(T), ids);
  if (static_cast<int64_t>(rows.size_bytes()) != r.k * r.row_bytes) {
    return ffi::Error::InvalidArgument("sum rows: rows do not match [K, ...] of the result");
  }
  char* o = static_cast<char*>(out->untyped_data());
  jaxsparse_rows::ParallelRanges(pool, r.n, WorthSplitting(r.n * r.row_bytes),
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
