/* The benchmark's floor: the least an allocator loaded through PyTorch's CUDAPluggableAllocator
 * can cost (`floor` in bench/configs.py). A worker that installs it measures PyTorch's pluggable
 * path itself (its std::function calls and its own bookkeeping of every pointer) with an
 * allocator behind it that does next to nothing: what streampool's time ratios to native cannot
 * go below, whatever streampool does.
 *
 * What it does: a request is rounded up to its size class (512-byte steps up to 1 MiB, then
 * eight classes per doubling); a freed block is pushed on its class's stack and handed out again
 * by the next request of that class. A hit is a lock, an index and a pop: no driver call. A miss
 * calls cuMemAlloc; on failure every cached block is freed (cuMemFree) and it is tried once more.
 * Nothing goes back to the driver otherwise.
 *
 * What it is not: an allocator anyone should use. It serves one device and one stream, the
 * first it is asked for; a request for another returns NULL, which PyTorch reports as out of
 * memory (so a workload with side streams fails instead of reusing memory another stream may
 * still read). It ignores record_stream, keeps every block it ever made, and counts nothing.
 *
 * Built beside the library (bench/floor/build), carried to the GPU machine, named by
 * BENCH_FLOOR_LIBRARY. With -DFLOOR_HOST_MEMORY it takes host memory instead of device memory,
 * for the CPU tests (bench/tests/test_floor.py).
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define SMALL_STEP_BYTES 512u
#define SMALL_LIMIT_BYTES (1u << 20)
#define SMALL_CLASSES (SMALL_LIMIT_BYTES / SMALL_STEP_BYTES) /* 2048 */
#define CLASSES_PER_DOUBLING 8u
/* Doublings above 1 MiB up to 2^63: every size_t request has a class. */
#define LARGE_CLASSES ((63u - 20u) * CLASSES_PER_DOUBLING)
#define CLASSES (SMALL_CLASSES + LARGE_CLASSES)

typedef struct {
    void **blocks;
    size_t count;
    size_t capacity;
} Stack;

static Stack stacks[CLASSES];
static atomic_flag locked = ATOMIC_FLAG_INIT;
static int first_device = -1;
static void *first_stream;
static int have_first;

static void lock(void) {
    while (atomic_flag_test_and_set_explicit(&locked, memory_order_acquire)) {
    }
}

static void unlock(void) { atomic_flag_clear_explicit(&locked, memory_order_release); }

/* The class of a request and its bytes (the block a miss makes); 0 bytes when it has none. */
static size_t class_of(size_t size, size_t *class_bytes) {
    if (size <= SMALL_LIMIT_BYTES) {
        size_t k = (size + SMALL_STEP_BYTES - 1) / SMALL_STEP_BYTES; /* 1 ..= 2048 */
        *class_bytes = k * SMALL_STEP_BYTES;
        return k - 1;
    }
    unsigned top = 63u - (unsigned)__builtin_clzll((unsigned long long)(size - 1)); /* >= 20 */
    if (top >= 63u) {
        *class_bytes = 0;
        return 0;
    }
    /* (size - 1) lies in [2^top, 2^(top+1)): eight steps of 2^(top-3). */
    size_t step = (size_t)1 << (top - 3u);
    size_t eighth = ((size - 1) >> (top - 3u)) & (CLASSES_PER_DOUBLING - 1u);
    *class_bytes = ((size_t)1 << top) + (eighth + 1u) * step;
    return SMALL_CLASSES + (top - 20u) * CLASSES_PER_DOUBLING + eighth;
}

#ifdef FLOOR_HOST_MEMORY
static int device_alloc(void **ptr, size_t bytes) {
    *ptr = aligned_alloc(SMALL_STEP_BYTES, bytes);
    return *ptr == NULL;
}
static void device_free(void *ptr) { free(ptr); }
#else
typedef int (*AllocFn)(unsigned long long *, size_t);
typedef int (*FreeFn)(unsigned long long);
typedef int (*GetCtxFn)(void **);
typedef int (*RetainFn)(void **, int);
typedef int (*SetCtxFn)(void *);
static AllocFn mem_alloc;
static FreeFn mem_free;
static GetCtxFn ctx_get_current;
static RetainFn primary_ctx_retain;
static SetCtxFn ctx_set_current;

/* The driver's entry points, once (under the lock); 0 when they are there. */
static int load_driver(void) {
    if (mem_alloc != NULL) {
        return 0;
    }
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (cuda == NULL) {
        fprintf(stderr, "floor allocator: cannot load libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    mem_free = (FreeFn)dlsym(cuda, "cuMemFree_v2");
    ctx_get_current = (GetCtxFn)dlsym(cuda, "cuCtxGetCurrent");
    primary_ctx_retain = (RetainFn)dlsym(cuda, "cuDevicePrimaryCtxRetain");
    ctx_set_current = (SetCtxFn)dlsym(cuda, "cuCtxSetCurrent");
    AllocFn alloc = (AllocFn)dlsym(cuda, "cuMemAlloc_v2");
    if (!mem_free || !ctx_get_current || !primary_ctx_retain || !ctx_set_current || !alloc) {
        fprintf(stderr, "floor allocator: libcuda.so.1 lacks an entry point it needs\n");
        return 1;
    }
    mem_alloc = alloc;
    return 0;
}

static int device_alloc(void **ptr, size_t bytes) {
    if (load_driver() != 0) {
        return 1;
    }
    void *context = NULL;
    if (ctx_get_current(&context) != 0) {
        return 1;
    }
    if (context == NULL &&
        (primary_ctx_retain(&context, first_device) != 0 || ctx_set_current(context) != 0)) {
        return 1;
    }
    unsigned long long address = 0;
    if (mem_alloc(&address, bytes) != 0) {
        return 1;
    }
    *ptr = (void *)(uintptr_t)address;
    return 0;
}

static void device_free(void *ptr) { mem_free((unsigned long long)(uintptr_t)ptr); }
#endif

/* Frees every cached block (under the lock): before the one retry of a failed miss. */
static void free_cached(void) {
    for (size_t c = 0; c < CLASSES; c++) {
        for (size_t i = 0; i < stacks[c].count; i++) {
            device_free(stacks[c].blocks[i]);
        }
        stacks[c].count = 0;
    }
}

/* 0 when (device, stream) is the one this allocator serves (the first it was asked for). */
static int check_served(int device, void *stream, const char *call) {
    if (!have_first) {
        first_device = device;
        first_stream = stream;
        have_first = 1;
        return 0;
    }
    if (device == first_device && stream == first_stream) {
        return 0;
    }
    fprintf(stderr,
            "floor allocator: %s on device %d, stream %p: it serves device %d, stream %p only\n",
            call, device, stream, first_device, first_stream);
    return 1;
}

void *floor_malloc(ptrdiff_t size, int device, void *stream) {
    size_t class_bytes = 0;
    if (size <= 0) {
        return NULL;
    }
    size_t c = class_of((size_t)size, &class_bytes);
    if (class_bytes == 0) {
        return NULL;
    }
    lock();
    if (check_served(device, stream, "floor_malloc") != 0) {
        unlock();
        return NULL;
    }
    Stack *s = &stacks[c];
    if (s->count > 0) {
        void *ptr = s->blocks[--s->count];
        unlock();
        return ptr;
    }
    void *ptr = NULL;
    if (device_alloc(&ptr, class_bytes) != 0) {
        free_cached();
        if (device_alloc(&ptr, class_bytes) != 0) {
            ptr = NULL;
        }
    }
    unlock();
    return ptr;
}

void floor_free(void *ptr, ptrdiff_t size, int device, void *stream) {
    size_t class_bytes = 0;
    if (ptr == NULL || size <= 0) {
        return;
    }
    size_t c = class_of((size_t)size, &class_bytes);
    lock();
    if (class_bytes == 0 || check_served(device, stream, "floor_free") != 0) {
        unlock();
        return; /* never made here: leaked rather than handed out again */
    }
    Stack *s = &stacks[c];
    if (s->count == s->capacity) {
        size_t capacity = s->capacity ? 2 * s->capacity : 16;
        void **grown = realloc(s->blocks, capacity * sizeof(void *));
        if (grown == NULL) {
            unlock();
            return; /* no host memory for the stack: the block is leaked, not reused */
        }
        s->blocks = grown;
        s->capacity = capacity;
    }
    s->blocks[s->count++] = ptr;
    unlock();
}

/* For the tests: the class and its bytes. */
size_t floor_class_of(size_t size, size_t *class_bytes) { return class_of(size, class_bytes); }
