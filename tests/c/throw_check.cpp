// my_malloc must throw (not return NULL) on bad input and out of memory, and keep working after.
#include <climits>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include "../../include/streampool.h"

static int expect_throw(ssize_t size, int device, const char *prefix) {
  try {
    void *p = my_malloc(size, device, nullptr);
    std::fprintf(stderr, "FAIL: my_malloc(%zd, %d) returned %p instead of throwing\n", size, device, p);
    return 1;
  } catch (const std::exception &e) {
    if (std::strncmp(e.what(), prefix, std::strlen(prefix)) != 0) {
      std::fprintf(stderr, "FAIL: message %s lacks prefix %s\n", e.what(), prefix);
      return 1;
    }
    std::printf("caught: %s\n", e.what());
    return 0;
  }
}

static bool same_stats(const StreampoolStats &a, const StreampoolStats &b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

int main() {
  if (expect_throw((ssize_t)1 << 40, 0, "CUDA out of memory.")) return 1;
  // Bad arguments are rejected before anything is counted.
  StreampoolStats before{}, after{};
  if (streampool_get_stats(0, &before) != 0) return 1;
  if (expect_throw(-5, 0, "allocation size must not be negative, got -5")) return 1;
  if (expect_throw(-1, 0, "allocation size must not be negative, got -1")) return 1;
  if (expect_throw(-SSIZE_MAX - 1, 0, "allocation size must not be negative")) return 1;
  if (expect_throw(64, 7, "device index 7 is out of range")) return 1;
  if (expect_throw(64, -1, "device index -1 is out of range")) return 1;
  if (streampool_get_stats(0, &after) != 0) return 1;
  if (!same_stats(before, after)) {
    std::fprintf(stderr, "FAIL: a rejected my_malloc changed the statistics\n");
    return 1;
  }
  // The largest sizes ssize_t can carry are above streampool's maximum of 2^48 bytes: out of
  // memory, as PyTorch reports any request it cannot serve, with the reason; counted in num_ooms.
  if (expect_throw(SSIZE_MAX, 0, "CUDA out of memory. Tried to allocate 8192.00 PiB (9223372036854775807 bytes), which is larger than streampool's maximum of 256.00 TiB")) return 1;
  if (expect_throw(SSIZE_MAX - 511, 0, "CUDA out of memory. Tried to allocate 8192.00 PiB (9223372036854775296 bytes), which is larger than")) return 1;
  if (expect_throw(((ssize_t)1 << 48) + 1, 0, "CUDA out of memory. Tried to allocate 256.00 TiB (281474976710657 bytes), which is larger than")) return 1;
  if (streampool_get_stats(0, &after) != 0) return 1;
  if (after.num_ooms != before.num_ooms + 3) {
    std::fprintf(stderr, "FAIL: sizes above the maximum were not counted as out of memory\n");
    return 1;
  }
  void *p = my_malloc(4096, 0, nullptr);
  if (!p) return 1;
  my_free(p, 4096, 0, nullptr);
  std::printf("throw ok\n");
  return 0;
}
