/* Calls every export of include/streampool.h on the simulated driver (tests/c_abi.rs checks that
 * every function the header declares is called here). Exit 0 = all good. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "../../include/streampool.h"

#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "FAIL %s:%d %s (last error: %s)\n", __FILE__, __LINE__, #cond, streampool_last_error()); return 1; } } while (0)
#define OK STREAMPOOL_STATUS_OK
#define INVALID STREAMPOOL_STATUS_INVALID_ARGUMENT
/* Entries that return nothing set the last error on failure only: a successful call with a
 * status clears it first (as python/streampool/_lib.py's call_reporting does). */
#define CLEAR() CHECK(streampool_device_count() == 2 && streampool_last_error()[0] == '\0')

static int same_stats(const StreampoolStats *a, const StreampoolStats *b) {
  return memcmp(a, b, sizeof *a) == 0;
}

/* Sizes near SIZE_MAX used to wrap to small blocks in release builds (and to panic, as an
 * internal error, in debug ones). Above the maximum of 2^48 bytes a size is out of memory, as
 * PyTorch reports any request it cannot serve: PyTorch's message with the reason, counted in
 * num_ooms, nothing else changed. */
static int oversized(void) {
  const char *e = streampool_last_error();
  return strncmp(e, "CUDA out of memory. Tried to allocate ", 38) == 0 &&
         strstr(e, "which is larger than streampool's maximum of 256.00 TiB") != NULL;
}

static int oversized_sizes_are_refused(void *stream) {
  StreampoolStats before, after;
  CHECK(streampool_get_stats(0, &before) == OK);
  for (size_t k = 0; k <= 2048; k++) {
    CHECK(streampool_malloc(SIZE_MAX - k, 0, stream) == NULL);
    CHECK(oversized());
  }
  CHECK(streampool_malloc(((size_t)1 << 48) + 1, 0, stream) == NULL);
  CHECK(oversized());
  CHECK(streampool_get_stats(0, &after) == OK);
  CHECK(after.num_ooms == before.num_ooms + 2050);
  after.num_ooms = before.num_ooms;
  CHECK(same_stats(&before, &after));
  /* At or below the maximum, more than the device has is out of memory. */
  CHECK(streampool_malloc((size_t)1 << 47, 0, stream) == NULL);
  CHECK(strncmp(streampool_last_error(), "CUDA out of memory.", 19) == 0);
  return 0;
}

/* The timeline and the block listing while two blocks are live. */
static int history_and_blocks(void *a, void *b) {
  size_t count = 0;
  uint64_t dropped = 1;
  CHECK(streampool_history(NULL, 0, &count, &dropped) == OK && count >= 4 && dropped == 0);
  StreampoolEvent events[64];
  CHECK(count <= 64 && streampool_history(events, 64, &count, NULL) == OK);
  CHECK(events[count - 1].kind == STREAMPOOL_EVENT_KIND_ALLOC && events[count - 1].address == (uint64_t)b);
  CHECK(events[0].time_ns <= events[count - 1].time_ns);
  CHECK(streampool_history(events, 64, NULL, NULL) == INVALID);
  StreampoolBlock blocks[8];
  CHECK(streampool_blocks(0, NULL, 0, &count) == OK && count == 2);
  CHECK(streampool_blocks(0, blocks, 1, &count) == OK && count == 1);
  CHECK(streampool_blocks(0, blocks, 8, &count) == OK && count == 2);
  for (size_t i = 0; i < count; i++) {
    CHECK(blocks[i].state == STREAMPOOL_BLOCK_STATE_LIVE && blocks[i].device == 0);
    CHECK(blocks[i].address == (uint64_t)a || blocks[i].address == (uint64_t)b);
  }
  CHECK(streampool_blocks(5, blocks, 8, &count) == INVALID);
  /* What the device holds in all: at least the two blocks. */
  uint64_t current = 0, peak = 0;
  CHECK(streampool_reserved_total(0, &current, &peak) == OK);
  CHECK(current >= blocks[0].block_bytes + blocks[1].block_bytes && peak >= current);
  CHECK(streampool_reserved_total(0, NULL, NULL) == INVALID);
  /* Stack contexts: none gathered here. */
  uint64_t contexts[64], pairs[16];
  CHECK(streampool_history_contexts(events, contexts, 64, &count, NULL) == OK && count >= 4);
  CHECK(contexts[count - 1] == 0);
  CHECK(streampool_history_contexts(events, NULL, 64, &count, NULL) == INVALID);
  CHECK(streampool_history_live_contexts(0, pairs, 8, &count) == OK && count == 0);
  CHECK(streampool_history_set_gatherer(NULL, 4) == INVALID);
  CHECK(streampool_history_set_gatherer(NULL, 0) == OK);
  return 0;
}

/* A shareable block exported, imported (here, by the same process), closed and released. */
static int sharing(void *stream) {
  CHECK(streampool_shareable_begin() == 1);
  void *shared = streampool_malloc(1 << 20, 1, stream);
  CHECK(shared != NULL);
  CHECK(streampool_shareable_end() == 0);
  CHECK(streampool_shareable_end() == INVALID);
  StreampoolIpcHandle handle;
  CHECK(streampool_ipc_export(shared, 1, stream, &handle) == OK);
  CHECK(handle.device == 1 && handle.block_bytes == (1 << 20) && handle.pool_fd >= 0);
  CHECK(streampool_ipc_export(shared, 1, stream, NULL) == INVALID);
  uint64_t pool = 0;
  CHECK(streampool_ipc_import_pool(1, handle.pool_fd, &pool) == OK);
  CHECK(streampool_ipc_import_pool(1, -1, &pool) == INVALID);
  void *imported = NULL;
  CHECK(streampool_ipc_import(pool, &handle, stream, &imported) == OK && imported == shared);
  CHECK(streampool_ipc_import(pool, NULL, stream, &imported) == INVALID);
  CHECK(streampool_ipc_close(imported, stream) == OK);
  CHECK(streampool_ipc_close(imported, stream) == STREAMPOOL_STATUS_UNKNOWN_POINTER);
  CHECK(streampool_ipc_release_export(1, handle.event) == OK);
  CHECK(streampool_ipc_release_export(1, handle.event) == INVALID);
  CHECK(streampool_free(shared, 1 << 20, 1, stream) == OK);
  /* A block of the ordinary pool cannot be exported. */
  void *plain = streampool_malloc(4096, 1, stream);
  CHECK(streampool_ipc_export(plain, 1, stream, &handle) == INVALID);
  CHECK(strstr(streampool_last_error(), "not in a shareable pool") != NULL);
  CHECK(streampool_free(plain, 4096, 1, stream) == OK);
  return 0;
}

/* Page by page: a block of the vmm backend (the program runs again with STREAMPOOL_BACKEND=vmm)
   is exported as one file descriptor per page and imported at new addresses; on the pool
   backend its blocks say they cannot be. */
static int page_sharing(void *stream) {
  void *block = streampool_malloc(3 << 20, 1, stream);
  CHECK(block != NULL);
  int kind = streampool_ipc_kind(block, 1);
  const char *backend = getenv("STREAMPOOL_BACKEND"); /* unset: the default, vmm */
  CHECK(kind == (backend == NULL || strcmp(backend, "vmm") == 0 ? 2 : 0));
  StreampoolIpcPages pages;
  int fds[8];
  void *imported = NULL;
  if (kind == 0) {
    CHECK(streampool_ipc_export_pages(block, 1, stream, &pages, fds, 8) == INVALID);
  } else {
    CHECK(kind == 2);
    CHECK(streampool_ipc_export_pages(block, 1, stream, &pages, fds, 1) == INVALID);
    CHECK(strstr(streampool_last_error(), "fds needs room for") != NULL);
    CHECK(streampool_ipc_export_pages(block, 1, stream, &pages, NULL, 8) == INVALID);
    CHECK(streampool_ipc_export_pages(block, 1, stream, &pages, fds, 8) == OK);
    CHECK(pages.page_count >= 2 && pages.block_bytes == (3 << 20) && pages.device == 1);
    CHECK(streampool_ipc_import_pages(&pages, fds, 1, stream, &imported) == INVALID);
    CHECK(streampool_ipc_import_pages(&pages, fds, pages.page_count, stream, &imported) == OK);
    CHECK(imported != NULL && imported != block);
    for (uint64_t i = 0; i < pages.page_count; i++) close(fds[i]);
    CHECK(streampool_ipc_close(imported, stream) == OK);
    /* An importer keeps the pages: no sleep until the export is released. */
    CHECK(streampool_sleep(1, 1, NULL) == INVALID);
    CHECK(strstr(streampool_last_error(), "shared with other processes") != NULL);
    CHECK(streampool_ipc_release_export(1, pages.event) == OK);
  }
  CHECK(streampool_ipc_kind((void *)0x1234, 1) == STREAMPOOL_STATUS_UNKNOWN_POINTER);
  CHECK(streampool_synchronizing(1) == OK && streampool_synchronizing(9) == INVALID);
  CHECK(streampool_synchronized(1) == OK && streampool_synchronized(9) == INVALID);
  /* Sleep and wake (the vmm backend; the pool backend refuses, changing nothing). */
  uint64_t slept = 0, woken = 0, sleeping = 1;
  if (kind == 2) {
    CHECK(streampool_sleep(1, 1, &slept) == OK && slept > 0);
    /* Everything held goes back; what lies under live blocks sleeps, and wakes. */
    CHECK(streampool_sleeping_bytes(1, &sleeping) == OK);
    CHECK(sleeping >= (3 << 20) && sleeping <= slept); /* the 3 MiB block is live */
    CHECK(streampool_malloc(4096, 1, stream) == NULL && strstr(streampool_last_error(), "asleep"));
    CHECK(streampool_wake(1, &woken) == OK && woken == sleeping);
  } else {
    CHECK(streampool_sleep(1, 1, &slept) == INVALID && slept == 0);
    CHECK(strstr(streampool_last_error(), "STREAMPOOL_BACKEND=vmm") != NULL);
  }
  CHECK(streampool_wake(1, NULL) == INVALID);
  CHECK(streampool_sleep(1, 7, NULL) == INVALID);
  CHECK(streampool_sleeping_bytes(1, &sleeping) == OK && sleeping == 0);
  CHECK(streampool_sleeping_bytes(1, NULL) == INVALID);
  /* Tags: a sleep that discards what the blocks allocated under one hold. */
  CHECK(streampool_tag_pop() == INVALID && strstr(streampool_last_error(), "no tag to pop"));
  CHECK(streampool_tag_push(NULL) == INVALID);
  CHECK(streampool_tag_push("kv\xff") == INVALID && strstr(streampool_last_error(), "UTF-8"));
  CHECK(streampool_tag_push("") == INVALID && strstr(streampool_last_error(), "empty"));
  CHECK(streampool_tag_push("abi_kv_cache") == OK);
  void *tagged = streampool_malloc(4096, 1, stream);
  CHECK(tagged != NULL && streampool_tag_pop() == OK);
  const char *unknown[] = {"abi_kv_cache", "abi_never_pushed"};
  CHECK(streampool_sleep_discarding(1, 1, unknown, 2, &slept) == INVALID);
  CHECK(strstr(streampool_last_error(), "abi_never_pushed") != NULL);
  CHECK(streampool_sleep_discarding(1, 1, NULL, 1, NULL) == INVALID);
  const char *discard[] = {"abi_kv_cache"};
  uint64_t saved = 1;
  if (kind == 2) {
    CHECK(streampool_sleep_discarding(1, 1, discard, 1, &slept) == OK && slept > 0);
    CHECK(streampool_sleep_saved_bytes(1, &saved) == OK && saved > 0 && saved < slept);
    uint64_t host = 0, freed = 1;
    CHECK(streampool_sleep_host_buffer_bytes(1, &host) == OK && host == saved);
    CHECK(streampool_release_sleep_buffer(1, &freed) == INVALID);
    CHECK(strstr(streampool_last_error(), "wake it first") != NULL);
    CHECK(streampool_wake(1, NULL) == OK);
    /* Awake, the buffer is kept for the next sleep until released. */
    CHECK(streampool_sleep_host_buffer_bytes(1, &host) == OK && host == saved);
    CHECK(streampool_release_sleep_buffer(1, &freed) == OK && freed == saved);
    CHECK(streampool_release_sleep_buffer(1, NULL) == OK);
    CHECK(streampool_sleep_host_buffer_bytes(1, &host) == OK && host == 0);
    /* Reserved ahead: pinned now, for what live blocks hold (NULL: the size not wanted). */
    uint64_t reserved = 0;
    CHECK(streampool_reserve_sleep_buffer(1, 0, &reserved) == OK && reserved > 0);
    CHECK(streampool_reserve_sleep_buffer(1, 0, NULL) == OK);
    CHECK(streampool_sleep_host_buffer_bytes(1, &host) == OK && host == reserved);
    CHECK(streampool_release_sleep_buffer(1, &freed) == OK && freed == reserved);
  } else {
    uint64_t host = 1;
    CHECK(streampool_sleep_host_buffer_bytes(1, &host) == OK && host == 0);
    CHECK(streampool_release_sleep_buffer(1, NULL) == OK);
    CHECK(streampool_sleep_discarding(1, 1, discard, 1, NULL) == INVALID);
    CHECK(strstr(streampool_last_error(), "STREAMPOOL_BACKEND=vmm") != NULL);
    CHECK(streampool_reserve_sleep_buffer(1, 0, NULL) == INVALID);
    CHECK(strstr(streampool_last_error(), "STREAMPOOL_BACKEND=vmm") != NULL);
  }
  CHECK(streampool_sleep_saved_bytes(1, &saved) == OK && saved == 0);
  CHECK(streampool_sleep_saved_bytes(1, NULL) == INVALID);
  CHECK(streampool_sleep_host_buffer_bytes(1, NULL) == INVALID);
  CHECK(streampool_free(tagged, 4096, 1, stream) == OK);
  CHECK(streampool_ipc_import_pages(NULL, fds, 1, stream, &imported) == INVALID);
  CHECK(streampool_free(block, 3 << 20, 1, stream) == OK);
  return 0;
}

/* PyTorch's memory pools (torch.cuda.graph, MemPool) through the hooks PyTorch calls, on
   device 1: a route without a filter claims every allocation of the device. */
static int memory_pools(void *stream) {
  StreampoolPoolBlock blocks[4];
  size_t n = 99;
  CHECK(streampool_graph_pool_use_count(1, 3, 4) == 0);
  CHECK(streampool_graph_pool_blocks(1, 3, 4, 0, blocks, 4, &n) == INVALID); /* no such pool */
  streampool_begin_allocate_to_pool(1, 3, 4, NULL);
  CHECK(streampool_graph_pool_use_count(1, 3, 4) == 1);
  void *p = my_malloc(4096, 1, stream);
  CHECK(streampool_graph_pool_blocks(1, 3, 4, 0, blocks, 4, &n) == OK && n == 1);
  CHECK(blocks[0].address == (uint64_t)(uintptr_t)p && blocks[0].requested_bytes == 4096);
  CHECK(streampool_graph_pool_blocks(1, 3, 4, 1, blocks, 4, &n) == OK && n == 1);
  CHECK(blocks[0].block_bytes == (2u << 20)); /* one segment */
  CHECK(streampool_graph_pool_blocks(1, 3, 4, 0, NULL, 0, NULL) == INVALID);
  streampool_end_allocate_to_pool(1, 3, 4);
  void *q = my_malloc(4096, 1, stream); /* outside the pool now */
  CHECK(streampool_graph_pool_blocks(1, 3, 4, 0, blocks, 4, &n) == OK && n == 1);
  my_free(p, 4096, 1, stream);
  CHECK(streampool_graph_pool_blocks(1, 3, 4, 0, blocks, 4, &n) == OK && n == 0);
  /* A block the allocator could not have handed out (misaligned, a size not a multiple of 512,
     smaller than the request) is refused and sets no directive: the next my_malloc allocates. */
  CHECK(streampool_graph_pool_expect_restore(1, 3, 4, (char *)p + 1, 4096, 4096, stream) == INVALID);
  CHECK(streampool_graph_pool_expect_restore(1, 3, 4, p, 4096, 4000, stream) == INVALID);
  CHECK(streampool_graph_pool_expect_restore(1, 3, 4, p, 8192, 4096, stream) == INVALID);
  CHECK(streampool_graph_pool_expect_restore(1, 3, 4, p, 4096, 4096, stream) == OK);
  CHECK(streampool_graph_pool_expect_restore(1, 3, 4, p, 8192, 4096, stream) == INVALID); /* clears it */
  void *fresh = my_malloc(4096, 1, stream);
  CHECK(fresh != NULL && fresh != p);
  my_free(fresh, 4096, 1, stream);
  fresh = my_malloc(8192, 1, stream);
  CHECK(fresh != NULL && fresh != p);
  my_free(fresh, 8192, 1, stream);
  /* A checkpointed block comes back at its old address through the next my_malloc. */
  CHECK(streampool_graph_pool_expect_restore(1, 3, 4, p, 4096, 4096, stream) == OK);
  CHECK(my_malloc(4096, 1, stream) == p);
  CHECK(streampool_graph_pool_blocks(1, 3, 4, 0, blocks, 4, &n) == OK && n == 1);
  CHECK(streampool_graph_pool_expect_restore(1, 3, 4, p, 0, 0, stream) == OK); /* clears */
  my_free(p, 4096, 1, stream);
  /* Two routes that both claim: the newest decides, as in PyTorch. */
  streampool_begin_allocate_to_pool(1, 3, 4, NULL);
  streampool_begin_allocate_to_pool(1, 5, 6, NULL);
  void *newest = my_malloc(4096, 1, stream);
  uint64_t ids[4];
  CHECK(streampool_graph_pool_ids(1, ids, 2, &n) == OK && n == 2); /* pools (3, 4) and (5, 6) */
  /* As streampool_blocks: with room for one, one copied; without a buffer, how many there are. */
  CHECK(streampool_graph_pool_ids(1, ids, 1, &n) == OK && n == 1);
  CHECK(streampool_graph_pool_ids(1, NULL, 0, &n) == OK && n == 2);
  CHECK(ids[0] + ids[2] == 8 && ids[1] + ids[3] == 10);
  CHECK(streampool_graph_pool_blocks(1, 5, 6, 0, blocks, 4, &n) == OK && n == 1);
  CHECK(blocks[0].address == (uint64_t)(uintptr_t)newest);
  streampool_end_allocate_to_pool(1, 5, 6);
  streampool_end_allocate_to_pool(1, 3, 4);
  my_free(newest, 4096, 1, stream);
  streampool_release_pool(1, 5, 6);
  streampool_release_pool(1, 3, 4);
  my_free(q, 4096, 1, stream);
  streampool_release_pool(1, 3, 4);
  CHECK(streampool_graph_pool_use_count(1, 3, 4) == 0);
  streampool_empty_cache(); /* nobody uses the pool: its memory goes back, the pool goes */
  CHECK(streampool_graph_pool_blocks(1, 3, 4, 1, blocks, 4, &n) == INVALID);
  CHECK(streampool_graph_pool_ids(1, NULL, 0, &n) == OK && n == 0); /* both gone */
  CHECK(streampool_graph_pool_ids(1, NULL, 0, NULL) == INVALID);
  CHECK(streampool_checkpoint_prepare(1, NULL, 0) == OK);
  CHECK(streampool_checkpoint_prepare(1, NULL, 2) == INVALID);
  CHECK(streampool_checkpoint_prepare(7, NULL, 0) == INVALID);
  /* Without PyTorch in the process there is no pluggable allocator to attach to. */
  CHECK(streampool_torch_attach() == NULL && strstr(streampool_last_error(), "libc10_cuda"));
  return 0;
}

int main(void) {
  StreampoolStats s;
  CHECK(strcmp(streampool_driver_name(), "sim") == 0);
  CHECK(strlen(streampool_version()) > 0);
  CHECK(streampool_check_config() == OK);
  /* One value for one variable, as if alone: the library's own words, nothing kept. */
  CHECK(streampool_check_setting("STREAMPOOL_RELEASE_THRESHOLD", "1.5GiB") == OK);
  CHECK(streampool_check_setting("STREAMPOOL_RELEASE_THRESHOLD", "5ki") == STREAMPOOL_STATUS_CONFIG_ERROR);
  CHECK(strstr(streampool_last_error(), "STREAMPOOL_RELEASE_THRESHOLD=\"5ki\" is not valid") != NULL);
  CHECK(streampool_check_setting("STREAMPOOL_RELEASE_TRESHOLD", "1GiB") == STREAMPOOL_STATUS_CONFIG_ERROR);
  CHECK(strstr(streampool_last_error(), "STREAMPOOL_RELEASE_THRESHOLD") != NULL); /* did you mean */
  CHECK(streampool_check_setting("PATH", "/bin") == INVALID);
  CHECK(streampool_check_setting(NULL, "1") == INVALID && streampool_check_setting("STREAMPOOL_LOG", NULL) == INVALID);
  CHECK(streampool_device_count() == 2);
  streampool_init(2);
  CHECK(streampool_last_error()[0] == '\0');
  CHECK(streampool_pools_supported(0) == 1 && streampool_ipc_supported(1) == 1);
  CHECK(streampool_vmm_supported(0) == 1);
  CHECK(streampool_pools_supported(2) == INVALID && streampool_ipc_supported(-1) == INVALID);
  CHECK(streampool_vmm_supported(2) == INVALID);
  CHECK(streampool_get_stats(0, &s) == OK && s.memory_limit_bytes == UINT64_MAX); /* no limit */
  CHECK(streampool_record_history(1, 100) == OK);
  CHECK(streampool_record_history(1, 0) == INVALID);
  CHECK(streampool_record_history(1, 100) == OK);
  void *stream = (void *)0x10;
  void *a = streampool_malloc(1000, 0, stream);
  void *b = streampool_malloc(1 << 20, 0, stream);
  CHECK(a && b && a != b);
  CHECK((uintptr_t)a % 512 == 0 && (uintptr_t)b % 512 == 0);
  CHECK(streampool_get_stats(0, &s) == OK);
  CHECK(s.allocated_bytes == 1000 + (1 << 20) && s.allocations_current == 2);
  if (history_and_blocks(a, b)) return 1;
  CHECK(streampool_record_history(0, 0) == OK);
  CLEAR();
  streampool_record_stream(b, (void *)0x20);
  CHECK(streampool_last_error()[0] == '\0');
  streampool_record_stream((void *)0x1234, (void *)0x20);
  CHECK(strstr(streampool_last_error(), "unknown pointer") != NULL);
  CHECK(streampool_free(a, 1000, 0, stream) == OK);
  CHECK(streampool_free(a, 1000, 0, stream) == STREAMPOOL_STATUS_UNKNOWN_POINTER);
  CHECK(strstr(streampool_last_error(), "unknown pointer") != NULL);
  CHECK(streampool_free(b, 1 << 20, 0, stream) == OK);
  CHECK(streampool_free(NULL, 0, 0, stream) == OK);
  CHECK(streampool_malloc(0, 0, stream) == NULL && streampool_last_error()[0] == '\0');
  CHECK(streampool_malloc(64, 5, stream) == NULL); /* sets the last error: the next call clears it */
  CHECK(streampool_malloc(0, 5, stream) == NULL && streampool_last_error()[0] == '\0'); /* any device */
  CHECK(streampool_malloc(64, 5, stream) == NULL && strstr(streampool_last_error(), "device index 5"));
  if (oversized_sizes_are_refused(stream)) return 1;
  CHECK(streampool_enable_peer_access(-1) == OK);
  CHECK(streampool_enable_peer_access(0) == OK);
  CHECK(streampool_enable_peer_access(7) == INVALID);
  if (sharing(stream)) return 1;
  if (page_sharing(stream)) return 1;
  uint64_t bytes = 0;
  CHECK(streampool_parse_bytes("50%", 0, &bytes) == OK && bytes == (8ull << 30));
  CHECK(streampool_parse_bytes("12XB", 0, &bytes) == INVALID);
  CHECK(streampool_parse_bytes(NULL, 0, &bytes) == INVALID);
  CHECK(streampool_set_release_threshold(0, 1 << 20) == OK);
  CHECK(streampool_set_release_threshold(-1, 0) == INVALID);
  CLEAR();
  streampool_set_memory_fraction(0.5, 0);
  CHECK(streampool_last_error()[0] == '\0');
  streampool_set_memory_fraction(1.5, 0);
  CHECK(strstr(streampool_last_error(), "memory fraction 1.5") != NULL);
  CLEAR();
  streampool_reset_peak_stats(0);
  CHECK(streampool_last_error()[0] == '\0');
  streampool_reset_peak_stats(9);
  CHECK(strstr(streampool_last_error(), "device index 9") != NULL);
  CLEAR();
  streampool_empty_cache();
  CHECK(streampool_last_error()[0] == '\0');
  CHECK(streampool_trim(0, 0) == OK);
  CHECK(streampool_trim(3, 0) == INVALID);
  CHECK(streampool_get_stats(0, &s) == OK);
  CHECK(s.allocated_bytes == 0 && s.cached_bytes == 0 && s.memory_limit_bytes == (8ull << 30));
  CHECK(s.allocated_bytes_peak == 0);
  CHECK(streampool_get_stats(0, NULL) == INVALID);
  streampool_set_memory_fraction(0.0, 0);
  CHECK(streampool_get_stats(0, &s) == OK && s.memory_limit_bytes == 0); /* a cap of 0 */
  CHECK(streampool_malloc(512, 0, stream) == NULL);
  CHECK(strncmp(streampool_last_error(), "CUDA out of memory.", 19) == 0);
  if (memory_pools(stream)) return 1;
  /* PyTorch's entry points */
  void *t = my_malloc(4096, 1, stream);
  CHECK(t != NULL && (uintptr_t)t % 512 == 0 && my_malloc(0, 1, stream) == NULL);
  CHECK(my_malloc(0, 7, stream) == NULL); /* size 0 is NULL whatever the device: no throw */
  my_free(t, 4096, 1, stream);
  my_free(NULL, 0, 1, stream);
  CHECK(streampool_get_stats(1, &s) == OK && s.allocated_bytes == 0);
  printf("c abi ok\n");
  return 0;
}
