/* A C program without a C++ runtime: loads libstreampool.so and a C++ plugin, both RTLD_LOCAL, and
   has the plugin catch my_malloc's exception. Usage: host LIBSTREAMPOOL PLUGIN */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

typedef void *(*my_malloc_fn)(ssize_t, int, void *);
typedef int (*plugin_fn)(my_malloc_fn, char *, size_t);

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  void *streampool = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  void *plugin = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!streampool || !plugin) {
    fprintf(stderr, "FAIL: dlopen: %s\n", dlerror());
    return 1;
  }
  if (dlsym(RTLD_DEFAULT, "__cxa_throw")) {
    fprintf(stderr, "FAIL: the C++ runtime is visible globally; the test needs it private\n");
    return 1;
  }
  my_malloc_fn my_malloc = (my_malloc_fn)dlsym(streampool, "my_malloc");
  plugin_fn catches = (plugin_fn)dlsym(plugin, "plugin_catches_oom");
  char message[512];
  if (!my_malloc || !catches || !catches(my_malloc, message, sizeof message)) {
    fprintf(stderr, "FAIL: the plugin did not catch a std::runtime_error\n");
    return 1;
  }
  if (strncmp(message, "CUDA out of memory.", 19) != 0) {
    fprintf(stderr, "FAIL: unexpected message: %s\n", message);
    return 1;
  }
  printf("caught privately: %s\n", message);
  return 0;
}
