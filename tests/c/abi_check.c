/* Calls every export through include/streampool.h on the simulated driver. Exit 0 = all good. */
#include <stdio.h>
#include <string.h>
#include "../../include/streampool.h"

#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d %s (last error: %s)\n", __FILE__, __LINE__, #cond, streampool_last_error()); return 1; } } while (0)

int main(void) {
  StreampoolStats s;
  CHECK(strcmp(streampool_driver_name(), "sim") == 0);
  CHECK(streampool_device_count() == 2);
  streampool_init(2);
  void *stream = (void *)0x10;
  void *a = streampool_malloc(1000, 0, stream);
  void *b = streampool_malloc(1 << 20, 0, stream);
  CHECK(a && b && a != b);
  CHECK(streampool_get_stats(0, &s) == STREAMPOOL_STATUS_OK);
  CHECK(s.allocated_bytes == 1000 + (1 << 20) && s.allocations_current == 2);
  streampool_record_stream(b, (void *)0x20);
  CHECK(streampool_free(a, 1000, 0, stream) == STREAMPOOL_STATUS_OK);
  CHECK(streampool_free(a, 1000, 0, stream) == STREAMPOOL_STATUS_UNKNOWN_POINTER);
  CHECK(strstr(streampool_last_error(), "unknown pointer") != NULL);
  CHECK(streampool_free(b, 1 << 20, 0, stream) == STREAMPOOL_STATUS_OK);
  CHECK(streampool_free(NULL, 0, 0, stream) == STREAMPOOL_STATUS_OK);
  CHECK(streampool_malloc(0, 0, stream) == NULL && streampool_last_error()[0] == '\0');
  CHECK(streampool_malloc(64, 5, stream) == NULL && strstr(streampool_last_error(), "device index 5"));
  CHECK(streampool_malloc((size_t)1 << 50, 0, stream) == NULL);
  CHECK(strncmp(streampool_last_error(), "CUDA out of memory.", 19) == 0);
  uint64_t bytes = 0;
  CHECK(streampool_parse_bytes("50%", 0, &bytes) == STREAMPOOL_STATUS_OK && bytes == (8ull << 30));
  CHECK(streampool_parse_bytes("12XB", 0, &bytes) == STREAMPOOL_STATUS_INVALID_ARGUMENT);
  CHECK(streampool_set_release_threshold(0, 1 << 20) == STREAMPOOL_STATUS_OK);
  CHECK(streampool_set_release_threshold(-1, 0) == STREAMPOOL_STATUS_INVALID_ARGUMENT);
  streampool_set_memory_fraction(0.5, 0);
  streampool_reset_peak_stats(0);
  streampool_empty_cache();
  CHECK(streampool_trim(0, 0) == STREAMPOOL_STATUS_OK);
  CHECK(streampool_get_stats(0, &s) == STREAMPOOL_STATUS_OK);
  CHECK(s.allocated_bytes == 0 && s.cached_bytes == 0 && s.memory_limit_bytes == (8ull << 30));
  CHECK(streampool_get_stats(0, NULL) == STREAMPOOL_STATUS_INVALID_ARGUMENT);
  CHECK(streampool_check_config() == STREAMPOOL_STATUS_OK);
  CHECK(strlen(streampool_version()) > 0);
  /* PyTorch's entry points */
  void *t = my_malloc(4096, 1, stream);
  CHECK(t != NULL && my_malloc(0, 1, stream) == NULL);
  my_free(t, 4096, 1, stream);
  my_free(NULL, 0, 1, stream);
  printf("c abi ok\n");
  return 0;
}
