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
 * first it is asked for (the benchmark's worker warms its libraries up on the default stream);
 * a request for another, or device memory it cannot get even after freeing its cache, ends the
 * process with a message on standard error (PyTorch does not check a pluggable allocator's
 * NULL, so returning one would hand a tensor a null address). It ignores record_stream, keeps
 * every block it ever made (a workload's peak memory under it is several times native's), and
 * counts nothing.
 *
 * Built beside the library (bench/floor/build), carried to the GPU machine, named by
 * BENCH_FLOOR_LIBRARY. With -DFLOOR_HOST_MEMORY it takes host memory instead of device memory,
 * for the CPU tests (bench/tests/test_floor.py).
 */
#include <dlfcn.h>
#include <pthread.h>
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
static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static int first_device = -1;
static void *first_stream;
static int have_first;

static void lock(void) { pthread_mutex_lock(&mutex); }

static void unlock(void) { pthread_mutex_unlock(&mutex); }

/* Ends the process: a request this allocator cannot serve. */
static void refuse(const char *what, ptrdiff_t size, int device, void *stream) {
    fprintf(stderr,
            "floor allocator: %s (%td bytes on device %d, stream %p; it serves device %d, stream "
            "%p only)\n",
            what, size, device, stream, first_device, first_stream);
    abort();
}

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
static size_t host_allocs, host_frees;
static int device_alloc(void **ptr, size_t bytes) {
    host_allocs++;
    *ptr = aligned_alloc(SMALL_STEP_BYTES, bytes);
    return *ptr == NULL;
}
static void device_free(void *ptr) {
    host_frees++;
    free(ptr);
}
/* For the tests: calls into "device" memory so far (allocations, frees). */
void floor_host_calls(size_t *allocs, size_t *frees) {
    lock();
    *allocs = host_allocs;
    *frees = host_frees;
    unlock();
}
#else
typedef int (*AllocFn)(unsigned long long *, size_t);
typedef int (*FreeFn)(unsigned long long);
typedef int (*GetCtxFn)(void **);
typedef int (*DeviceGetFn)(int *, int);
typedef int (*RetainFn)(void **, int);
typedef int (*SetCtxFn)(void *);
static AllocFn mem_alloc;
static FreeFn mem_free;
static GetCtxFn ctx_get_current;
static DeviceGetFn device_get;
static RetainFn primary_ctx_retain;
static SetCtxFn ctx_set_current;
/* The served device's primary context, retained once (and kept: the process's life). */
static void *primary;

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
    device_get = (DeviceGetFn)dlsym(cuda, "cuDeviceGet");
    primary_ctx_retain = (RetainFn)dlsym(cuda, "cuDevicePrimaryCtxRetain");
    ctx_set_current = (SetCtxFn)dlsym(cuda, "cuCtxSetCurrent");
    AllocFn alloc = (AllocFn)dlsym(cuda, "cuMemAlloc_v2");
    if (!mem_free || !ctx_get_current || !device_get || !primary_ctx_retain || !ctx_set_current ||
        !alloc) {
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
    /* The served device's primary context, current on this thread (PyTorch makes it current on
     * the threads it allocates from; a thread with none gets it here). */
    int cu_device = 0;
    if (primary == NULL &&
        (device_get(&cu_device, first_device) != 0 || primary_ctx_retain(&primary, cu_device) != 0)) {
        primary = NULL;
        return 1;
    }
    void *context = NULL;
    if (ctx_get_current(&context) != 0) {
        return 1;
    }
    if (context != primary && ctx_set_current(primary) != 0) {
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

/* Frees every cached block (under the lock): before the one retry of a failed miss. Returns how
 * many it freed. */
static size_t free_cached(void) {
    size_t freed = 0;
    for (size_t c = 0; c < CLASSES; c++) {
        for (size_t i = 0; i < stacks[c].count; i++) {
            device_free(stacks[c].blocks[i]);
        }
        freed += stacks[c].count;
        stacks[c].count = 0;
    }
    return freed;
}

/* 0 when (device, stream) is the one this allocator serves (the first it was asked for). */
static int check_served(int device, void *stream) {
    if (!have_first) {
        first_device = device;
        first_stream = stream;
        have_first = 1;
        return 0;
    }
    return device == first_device && stream == first_stream ? 0 : 1;
}

void *floor_malloc(ptrdiff_t size, int device, void *stream) {
    size_t class_bytes = 0;
    if (size <= 0) {
        return NULL; /* (PyTorch asks for 0 bytes for empty tensors: no address is needed) */
    }
    /* A positive ptrdiff_t is below 2^63: it has a class. */
    size_t c = class_of((size_t)size, &class_bytes);
    lock();
    if (check_served(device, stream) != 0) {
        refuse("floor_malloc: another device or stream", size, device, stream);
    }
    Stack *s = &stacks[c];
    if (s->count > 0) {
        void *ptr = s->blocks[--s->count];
        unlock();
        return ptr;
    }
    void *ptr = NULL;
    if (device_alloc(&ptr, class_bytes) != 0) {
        size_t freed = free_cached();
        if (device_alloc(&ptr, class_bytes) != 0) {
            fprintf(stderr, "floor allocator: %zu cached block(s) freed before the retry\n", freed);
            refuse("floor_malloc: out of memory after freeing its cache", size, device, stream);
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
    if (check_served(device, stream) != 0) {
        refuse("floor_free: another device or stream", size, device, stream);
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

/* For the tests: the class and its bytes (0 bytes: a size_t past the largest class). */
size_t floor_class_of(size_t size, size_t *class_bytes) { return class_of(size, class_bytes); }
