// The value/index dtype dispatch shared by the native kernels.
#ifndef JAXSPARSE_ROWS_NATIVE_DISPATCH_H_
#define JAXSPARSE_ROWS_NATIVE_DISPATCH_H_

#include <cstdint>
#include <new>

#include "xla/ffi/api/ffi.h"

namespace jaxsparse_rows {

// Calls kernel(T{}, I{}) with T the value type (float32/float64) and I the
// index type (int32/int64) named by `values` and `ids`, and returns its error.
// An allocation failure inside the kernel becomes an FFI error instead of
// aborting the process; other dtypes are an InvalidArgument error.
template <typename Kernel>
xla::ffi::Error ForDtypes(xla::ffi::DataType values, xla::ffi::DataType ids, Kernel kernel) {
  using xla::ffi::DataType;
  try {
    if (values == DataType::F32 && ids == DataType::S32) return kernel(float{}, int32_t{});
    if (values == DataType::F32 && ids == DataType::S64) return kernel(float{}, int64_t{});
    if (values == DataType::F64 && ids == DataType::S32) return kernel(double{}, int32_t{});
    if (values == DataType::F64 && ids == DataType::S64) return kernel(double{}, int64_t{});
  } catch (const std::bad_alloc&) {
    return xla::ffi::Error(xla::ffi::ErrorCode::kResourceExhausted,
                           "out of memory in a jaxsparse_rows native kernel");
  }
  return xla::ffi::Error::InvalidArgument(
      "supported dtypes: float32/float64 values, int32/int64 ids");
}

// Calls kernel(I{}) with I the index type (int32/int64) named by `ids`, and
// returns its error, with the same allocation-failure handling as ForDtypes.
template <typename Kernel>
xla::ffi::Error ForIdType(xla::ffi::DataType ids, Kernel kernel) {
  using xla::ffi::DataType;
  try {
    if (ids == DataType::S32) return kernel(int32_t{});
    if (ids == DataType::S64) return kernel(int64_t{});
  } catch (const std::bad_alloc&) {
    return xla::ffi::Error(xla::ffi::ErrorCode::kResourceExhausted,
                           "out of memory in a jaxsparse_rows native kernel");
  }
  return xla::ffi::Error::InvalidArgument("ids must be int32 or int64");
}

}  // namespace jaxsparse_rows

#endif  // JAXSPARSE_ROWS_NATIVE_DISPATCH_H_
