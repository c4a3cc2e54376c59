// Calls PyTorch's entry point my_malloc, which throws a C++ exception instead of returning NULL,
// and catches that exception: Rust cannot catch a foreign exception (catch_unwind aborts), so
// the C-ABI fuzz target (fuzz_targets/c_abi.rs) calls my_malloc through here. my_malloc comes in
// as a function pointer, so this file needs no symbol of the library at link time.
#include <cstddef>
#include <cstring>
#include <exception>
#include <sys/types.h>

typedef void *(*my_malloc_fn)(ssize_t size, int device, void *stream);

// *threw: 0 if my_malloc returned, 1 if it threw a std::exception (message copied, NUL-ended,
// into `message` of `capacity` bytes), 2 if it threw anything else.
extern "C" void *fuzz_catch_my_malloc(my_malloc_fn my_malloc, ssize_t size, int device, void *stream,
                                      char *message, size_t capacity, int *threw) {
  *threw = 0;
  message[0] = '\0';
  try {
    return my_malloc(size, device, stream);
  } catch (const std::exception &e) {
    *threw = 1;
    std::strncpy(message, e.what(), capacity - 1);
    message[capacity - 1] = '\0';
  } catch (...) {
    *threw = 2;
  }
  return nullptr;
}
