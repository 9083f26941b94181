// The linear-verify accept rule for one request, shared by the CPU op (dflash_ops.cpp) and the CUDA
// kernel (dflash_ops_cuda.cu) so the two cannot drift: one definition, compiled for host and device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DFLASH_HOST_DEVICE __host__ __device__
#else
#define DFLASH_HOST_DEVICE
#endif

namespace sglang_dflash {

struct Accepted {
  int64_t accept;  // drafts equal to the target's token at their row
  int64_t commit;  // tokens committed: accepted + bonus, cut to the budget and at the first stop id
};

// draft [B]: row 0 the last committed token, rows 1.. the drafts; target [B]: the target's token
// after each row; stops [S]: the request's stop ids (-1 padded); budget: tokens it may still emit.
DFLASH_HOST_DEVICE inline Accepted accept_row(const int64_t* draft, const int64_t* target, const int64_t* stops,
                                              int64_t B, int64_t S, int64_t budget) {
  int64_t a = 0;
  while (a + 1 < B && draft[a + 1] == target[a]) ++a;
  const int64_t most = budget > 1 ? budget : 1;
  int64_t c = a + 1 < most ? a + 1 : most;
  for (int64_t j = 0; j < c; ++j) {
    bool stop = false;
    for (int64_t s = 0; s < S; ++s) stop |= (stops[s] == target[j]);
    if (stop) {
      c = j + 1;
      break;
    }
  }
  return {a, c};
}

}  // namespace sglang_dflash
