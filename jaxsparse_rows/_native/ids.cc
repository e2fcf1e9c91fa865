// Native CPU kernels for the id bookkeeping of row-sparse ops, registered with
// XLA through the typed FFI; see jaxsparse_rows/_native/__init__.py. The XLA
// implementations in jaxsparse_rows/_ids.py (`_unique_xla`, `_slots_xla`) stay
// the reference, the GPU path and the fallback.
//
//   unique: uniq[capacity] = the sorted distinct ids in [0, N), padded with N
//           (the largest left out past capacity); count = how many there are;
//           slots[i] = the position of ids[i] in uniq, or capacity when ids[i]
//           is outside [0, N) or was left out.
//   search: slots[i] = the position of queries[i] in a sorted id list, or the
//           list's length when absent or outside [0, N).
//
// `unique` replaces a sort, a prefix sum, a compaction scatter and a binary
// search with one radix sort of (id, position) pairs and one pass. `search`
// is a branchless binary search, eight queries interleaved so that their
// loads overlap. Every index read from the inputs is range-checked: malformed
// input (an unsorted list) gives unspecified slots, never an out-of-bounds
// access.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "dispatch.h"
#include "parallel.h"
#include "radix.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kSmallSort = 256;            // below this, a comparison sort
constexpr int64_t kSearchGroup = 8;            // queries searched together
constexpr int64_t kParallelMinProbes = 1 << 16;  // binary-search steps worth a thread

template <typename I>
struct Entry {
  I id;
  I pos;
};

template <typename I>
ffi::Error UniqueT(ffi::AnyBuffer ids_b, int64_t n_rows, ffi::Result<ffi::AnyBuffer> uniq_b,
                   ffi::Result<ffi::AnyBuffer> count_b, ffi::Result<ffi::AnyBuffer> slots_b) {
  const int64_t n = static_cast<int64_t>(ids_b.element_count());
  const int64_t cap = static_cast<int64_t>(uniq_b->element_count());
  if (static_cast<int64_t>(slots_b->element_count()) != n || count_b->element_count() != 1) {
    return ffi::Error::InvalidArgument("unique: results must be uniq[capacity], count[], slots[n]");
  }
  if (n > std::numeric_limits<I>::max() || cap > std::numeric_limits<I>::max() ||
      n_rows > std::numeric_limits<I>::max()) {
    return ffi::Error::InvalidArgument("unique: sizes do not fit the id dtype");
  }
  const I* ids = ids_b.typed_data<I>();
  I* uniq = uniq_b->typed_data<I>();
  I* slots = slots_b->typed_data<I>();
  std::vector<Entry<I>> a;
  a.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] >= 0 && ids[i] < n_rows) {
      a.push_back({ids[i], static_cast<I>(i)});
    } else {
      slots[i] = static_cast<I>(cap);
    }
  }
  if (static_cast<int64_t>(a.size()) < kSmallSort) {
    std::sort(a.begin(), a.end(), [](const Entry<I>& x, const Entry<I>& y) { return x.id < y.id; });
  } else {
    std::vector<Entry<I>> scratch;
    jaxsparse_rows::RadixSort(a, scratch, jaxsparse_rows::KeyBits(n_rows),
                              [](const Entry<I>& e) { return e.id; });
  }
  int64_t count = 0;
  for (size_t j = 0; j < a.size(); ++j) {
    if (j == 0 || a[j].id != a[j - 1].id) {
      if (count < cap) uniq[count] = a[j].id;
      ++count;
    }
    slots[a[j].pos] = static_cast<I>(count <= cap ? count - 1 : cap);
  }
  for (int64_t u = std::min(count, cap); u < cap; ++u) uniq[u] = static_cast<I>(n_rows);
  *count_b->typed_data<I>() = static_cast<I>(count);
  return ffi::Error::Success();
}

template <typename I>
ffi::Error SearchT(ffi::ThreadPool& pool, ffi::AnyBuffer sorted_b, ffi::AnyBuffer queries_b,
                   int64_t n_rows, ffi::Result<ffi::AnyBuffer> slots_b) {
  const int64_t k = static_cast<int64_t>(sorted_b.element_count());
  const int64_t m = static_cast<int64_t>(queries_b.element_count());
  if (static_cast<int64_t>(slots_b->element_count()) != m) {
    return ffi::Error::InvalidArgument("search: slots must match the queries");
  }
  if (k > std::numeric_limits<I>::max()) {
    return ffi::Error::InvalidArgument("search: the sorted list is too long for the id dtype");
  }
  const I* s = sorted_b.typed_data<I>();
  const I* q = queries_b.typed_data<I>();
  I* slots = slots_b->typed_data<I>();
  if (k == 0) {
    std::fill(slots, slots + m, I{0});
    return ffi::Error::Success();
  }
  const int64_t probes = m * (jaxsparse_rows::KeyBits(k) + 1);
  jaxsparse_rows::ParallelRanges(pool, m, probes >= kParallelMinProbes, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i += kSearchGroup) {
      const int64_t g = std::min(kSearchGroup, e - i);
      int64_t base[kSearchGroup] = {};
      I key[kSearchGroup] = {};
      for (int64_t j = 0; j < g; ++j) key[j] = q[i + j];
      // Invariant: base + len <= k, so every probe base + half < k.
      for (int64_t len = k; len > 1; len -= len / 2) {
        const int64_t half = len / 2;
        for (int64_t j = 0; j < kSearchGroup; ++j) {
          base[j] = s[base[j] + half] < key[j] ? base[j] + half : base[j];
        }
      }
      for (int64_t j = 0; j < g; ++j) {
        const int64_t pos = base[j] + (s[base[j]] < key[j] ? 1 : 0);
        const bool hit = key[j] >= 0 && key[j] < n_rows && pos < k && s[pos] == key[j];
        slots[i + j] = static_cast<I>(hit ? pos : k);
      }
    }
  });
  return ffi::Error::Success();
}

ffi::Error Unique(ffi::AnyBuffer ids, ffi::Result<ffi::AnyBuffer> uniq,
                  ffi::Result<ffi::AnyBuffer> count, ffi::Result<ffi::AnyBuffer> slots,
                  int64_t n_rows) {
  const auto t = ids.element_type();
  if (uniq->element_type() != t || count->element_type() != t || slots->element_type() != t) {
    return ffi::Error::InvalidArgument("unique: ids and results must share one dtype");
  }
  return jaxsparse_rows::ForIdType(t, [&](auto i) {
    return UniqueT<decltype(i)>(ids, n_rows, uniq, count, slots);
  });
}

ffi::Error Search(ffi::ThreadPool pool, ffi::AnyBuffer sorted, ffi::AnyBuffer queries,
                  ffi::Result<ffi::AnyBuffer> slots, int64_t n_rows) {
  const auto t = sorted.element_type();
  if (queries.element_type() != t || slots->element_type() != t) {
    return ffi::Error::InvalidArgument("search: ids, queries and slots must share one dtype");
  }
  return jaxsparse_rows::ForIdType(t, [&](auto i) {
    return SearchT<decltype(i)>(pool, sorted, queries, n_rows, slots);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jsr_unique_ids, Unique,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // ids [n]
                                  .Ret<ffi::AnyBuffer>()  // uniq [capacity]
                                  .Ret<ffi::AnyBuffer>()  // count []
                                  .Ret<ffi::AnyBuffer>()  // slots [n]
                                  .Attr<int64_t>("n_rows"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(jsr_search_ids, Search,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // sorted ids [k]
                                  .Arg<ffi::AnyBuffer>()  // queries [m]
                                  .Ret<ffi::AnyBuffer>()  // slots [m]
                                  .Attr<int64_t>("n_rows"));
