// A C++ plugin that calls my_malloc and catches what it throws, loaded with RTLD_LOCAL by a C host
// (private_runtime_host.c): PyTorch's situation inside Python, where libstdc++ comes in privately
// with torch and is not visible to dlsym(RTLD_DEFAULT).
#include <cstring>
#include <stdexcept>
#include <sys/types.h>

using my_malloc_fn = void *(*)(ssize_t, int, void *);

extern "C" int plugin_catches_oom(my_malloc_fn my_malloc, char *message, size_t capacity) {
  try {
    my_malloc((ssize_t)1 << 45, 0, nullptr);  // 32 TiB: more than the device, within the maximum
  } catch (const std::runtime_error &e) {
    std::strncpy(message, e.what(), capacity - 1);
    message[capacity - 1] = '\0';
    return 1;
  }
  return 0;
}
