// A parallel loop on XLA's intra-op thread pool, shared by the native kernels.
#ifndef JAXSPARSE_ROWS_NATIVE_PARALLEL_H_
#define JAXSPARSE_ROWS_NATIVE_PARALLEL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace jaxsparse_rows {

// Runs body(i) for every i in [0, n) over `pieces` contiguous ranges, claimed by
// the calling thread and by tasks on XLA's pool; body(begin, end) gets a range.
// The caller waits only for ranges another thread has claimed (and is
// running), so a busy pool delays nothing and cannot deadlock. Tasks that
// start late find nothing left and touch nothing but the shared counters, so
// `body` may refer to the caller's stack.
template <typename Body>
void ParallelRanges(xla::ffi::ThreadPool& pool, int64_t n, bool worth_it, Body body) {
  const int64_t threads = pool.num_threads();
  if (threads <= 1 || n <= 1 || !worth_it) {
    body(int64_t{0}, n);
    return;
  }
  const int64_t pieces = n < threads * 8 ? n : threads * 8;
  const int64_t per_piece = (n + pieces - 1) / pieces;
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  auto state = std::make_shared<State>();
  auto run = [state, body, n, pieces, per_piece]() {
    for (int64_t i; (i = state->next.fetch_add(1)) < pieces;) {
      const int64_t begin = i * per_piece < n ? i * per_piece : n;
      const int64_t end = begin + per_piece < n ? begin + per_piece : n;
      body(begin, end);
      if (state->done.fetch_add(1) + 1 == pieces) {
        std::lock_guard<std::mutex> lock(state->mu);
        state->cv.notify_all();
      }
    }
  };
  // One task per other thread, or per other piece where there are fewer.
  const int64_t helpers = (pieces < threads ? pieces : threads) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([run]() { run(); });
  run();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done.load() == pieces; });
}

}  // namespace jaxsparse_rows

#endif  // JAXSPARSE_ROWS_NATIVE_PARALLEL_H_
