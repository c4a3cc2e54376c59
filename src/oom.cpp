// Throws a C++ exception for PyTorch's entry point (my_malloc): PyTorch turns it into a Python
// RuntimeError with this message, where a NULL return would poison the CUDA context.
#include <stdexcept>

extern "C" [[noreturn]] void streampool_throw_runtime_error(const char *message) {
  throw std::runtime_error(message);
}
