/* The header's STREAMPOOL_MAX_ALLOCATION_BYTES is 2^48 for a C program too (tests/c_abi.rs). */
#include <stdint.h>
#include <stdio.h>
#include "../../include/streampool.h"

int main(void) {
  uint64_t max = STREAMPOOL_MAX_ALLOCATION_BYTES;
  if (max != (uint64_t)1 << 48) {
    fprintf(stderr, "FAIL: STREAMPOOL_MAX_ALLOCATION_BYTES is %llu in C\n", (unsigned long long)max);
    return 1;
  }
  printf("max ok\n");
  return 0;
}
