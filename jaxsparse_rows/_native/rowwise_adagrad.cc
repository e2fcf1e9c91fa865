// Row-wise AdaGrad's update of the listed rows of a RowSparse gradient, fused
// into one pass over them (FBGEMM's EXACT_ROWWISE_ADAGRAD, with the learning
// rate folded in as `alpha`):
//
//   for each i with ids[i] in [0, N), r = ids[i]:
//     acc[r] += sum(g[i, :] ** 2) / D
//     scale = 1 / (sqrt(acc[r]) + eps), or 0 where that denominator is 0
//     u[i, :] = (g[i, :] * scale) * alpha
//   u[i, :] = 0 for every other id (RowSparse padding)
//
// In XLA ops this is a gather of the [N] accumulator, a row reduction, a
// scatter back and passes over the [K] scales and the [K, ...] rows, each a
// separate step on XLA:CPU; the reduction of 64-wide rows alone took longer
// than this whole loop. Writing u here, while the gradient row is still in
// L1, reads the gradient from memory once: when XLA computed u from per-row
// scales, the step read it twice, and that second pass was most of what kept
// the step above its gather/scatter floor. Those ops stay the reference, the
// GPU path and the fallback (jaxsparse_rows/optim/_rowwise_rows.py).
//
// The accumulator result aliases its operand (a donated accumulator is updated
// in place). Ids are range-checked like the row kernels' (rows.h): malformed
// ids give unspecified values, never an out-of-bounds access, and ids whose
// repeats are not adjacent run on one thread.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "dispatch.h"
#include "rows.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using jaxsparse_rows::ForIds;
using jaxsparse_rows::MakeRows;
using jaxsparse_rows::RepeatsAdjacent;
using jaxsparse_rows::Rows;
using jaxsparse_rows::WorthSplitting;

// sum(x[t] ** 2) over a row, in 8 independent partial sums that the compiler
// keeps in vector registers (one running sum would serialize on the latency
// of every addition).
template <typename T>
inline T SumOfSquares(const T* __restrict__ x, int64_t d) {
  constexpr int64_t kLanes = 8;
  T part[kLanes] = {};
  int64_t t = 0;
  for (; t + kLanes <= d; t += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) part[j] += x[t + j] * x[t + j];
  }
  for (int64_t j = 0; t < d; ++t, ++j) part[j] += x[t] * x[t];
  return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

template <typename T, typename I>
ffi::Error RowwiseAdagradT(ffi::ThreadPool& pool, ffi::AnyBuffer acc, ffi::AnyBuffer ids,
                           ffi::AnyBuffer grad, ffi::AnyBuffer eps, ffi::AnyBuffer alpha_buf,
                           ffi::Result<ffi::AnyBuffer> acc_out,
                           ffi::Result<ffi::AnyBuffer> dirs) {
  // XLA aliases `acc_out` with `acc`; copy only if it ever did not.
  if (acc_out->untyped_data() != acc.untyped_data()) {
    std::memcpy(acc_out->untyped_data(), acc.untyped_data(), acc.size_bytes());
  }
  const Rows<I> r = MakeRows<I>(acc_out->untyped_data(), acc.dimensions(), sizeof(T), ids);
  const int64_t count = static_cast<int64_t>(grad.element_count());
  const int64_t d = r.k > 0 ? count / r.k : 0;
  if (grad.dimensions().size() < 1 || grad.dimensions()[0] != r.k || d * r.k != count ||
      static_cast<int64_t>(dirs->element_count()) != count) {
    return ffi::Error::InvalidArgument("rowwise adagrad: the gradient rows are not [K, ...]");
  }
  const T* g = grad.typed_data<T>();
  T* u = dirs->typed_data<T>();
  const T size = static_cast<T>(d > 0 ? d : 1);
  const T e = eps.typed_data<T>()[0];
  const T alpha = alpha_buf.typed_data<T>()[0];
  const bool split = WorthSplitting(r.k * d * static_cast<int64_t>(sizeof(T))) && RepeatsAdjacent(r);
  ForIds(pool, r, split, [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      // Each accumulator is one element, prefetched a few ids ahead: the row
      // arithmetic between two of them hides the miss.
      T* a = reinterpret_cast<T*>(const_cast<char*>(r.Row(i, sizeof(T), true)));
      const T* __restrict__ gi = g + i * d;
      T* __restrict__ ui = u + i * d;
      if (a == nullptr) {
        // 0 * alpha, as the XLA ops scale the masked row (-0.0 for a
        // negative alpha, NaN for a NaN one): bit for bit the same rows
        for (int64_t t = 0; t < d; ++t) ui[t] = T(0) * alpha;
        continue;
      }
      const T total = *a + SumOfSquares(gi, d) / size;
      *a = total;
      const T denom = std::sqrt(total) + e;
      const T s = denom == T(0) ? T(0) : T(1) / denom;
      // (g * s) * alpha, in the order of the XLA ops (the row is in L1 now)
      for (int64_t t = 0; t < d; ++t) ui[t] = (gi[t] * s) * alpha;
    }
  });
  return ffi::Error::Success();
}

ffi::Error RowwiseAdagrad(ffi::ThreadPool pool, ffi::AnyBuffer acc, ffi::AnyBuffer ids,
                          ffi::AnyBuffer grad, ffi::AnyBuffer eps, ffi::AnyBuffer alpha,
                          ffi::Result<ffi::AnyBuffer> acc_out,
                          ffi::Result<ffi::AnyBuffer> dirs) {
  const auto t = acc.element_type();
  if (acc.dimensions().size() != 1) {
    return ffi::Error::InvalidArgument("rowwise adagrad: the accumulator must be 1-D [N]");
  }
  if (grad.element_type() != t || eps.element_type() != t || alpha.element_type() != t ||
      acc_out->element_type() != t || dirs->element_type() != t) {
    return ffi::Error::InvalidArgument(
        "rowwise adagrad: accumulator, gradient, eps and alpha dtypes differ");
  }
  if (eps.element_count() != 1 || alpha.element_count() != 1) {
    return ffi::Error::InvalidArgument("rowwise adagrad: eps and alpha must be scalars");
  }
  if (ids.dimensions().size() != 1) {
    return ffi::Error::InvalidArgument("rowwise adagrad: ids must be 1-D");
  }
  return jaxsparse_rows::ForDtypes(t, ids.element_type(), [&](auto v, auto i) {
    return RowwiseAdagradT<decltype(v), decltype(i)>(pool, acc, ids, grad, eps, alpha, acc_out,
                                                     dirs);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jsr_rowwise_adagrad, RowwiseAdagrad,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // accumulator [N]
                                  .Arg<ffi::AnyBuffer>()  // ids [K]
                                  .Arg<ffi::AnyBuffer>()  // gradient rows [K, ...]
                                  .Arg<ffi::AnyBuffer>()  // eps, a scalar of their dtype
                                  .Arg<ffi::AnyBuffer>()  // alpha, a scalar of their dtype
                                  .Ret<ffi::AnyBuffer>()  // the accumulator, aliased
                                  .Ret<ffi::AnyBuffer>()  // direction rows [K, ...]
);
