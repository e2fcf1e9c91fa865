// A stable LSD radix sort by a non-negative integer key, shared by the native
// kernels that group entries by id.
#ifndef JAXSPARSE_ROWS_NATIVE_RADIX_H_
#define JAXSPARSE_ROWS_NATIVE_RADIX_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace jaxsparse_rows {

constexpr int kRadixDigitBits = 11;

// The number of bits that hold every key below `bound` (0 when bound <= 1).
inline int KeyBits(int64_t bound) {
  int bits = 0;
  while (bits < 63 && (int64_t{1} << bits) < bound) ++bits;
  return bits;
}

// Sorts `a` stably by key(e) in [0, 2^bits), 11 bits per pass; `a` holds the
// result and `scratch` is reused as the other buffer.
template <typename E, typename Key>
void RadixSort(std::vector<E>& a, std::vector<E>& scratch, int bits, Key key) {
  constexpr int64_t kBuckets = int64_t{1} << kRadixDigitBits;
  scratch.resize(a.size());
  std::vector<int64_t> start(kBuckets);
  for (int shift = 0; shift < bits; shift += kRadixDigitBits) {
    std::fill(start.begin(), start.end(), 0);
    for (const auto& e : a) ++start[(static_cast<int64_t>(key(e)) >> shift) & (kBuckets - 1)];
    int64_t sum = 0;
    for (auto& c : start) {
      const int64_t n = c;
      c = sum;
      sum += n;
    }
    for (const auto& e : a) {
      scratch[start[(static_cast<int64_t>(key(e)) >> shift) & (kBuckets - 1)]++] = e;
    }
    a.swap(scratch);
  }
}

}  // namespace jaxsparse_rows

#endif  // JAXSPARSE_ROWS_NATIVE_RADIX_H_
