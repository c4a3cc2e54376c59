// A small class hierarchy shaped like PyTorch's allocator: exported overrides, and inline base
// methods between them that are not exported (as CUDAAllocator's defaults are not). The vtable
// patcher's unit tests (src/torch_edge/tests.rs) load it and patch one object.
namespace mock {
struct Base {
  virtual ~Base() {}
  virtual int a() = 0;
  virtual int hidden1() { return -1; }
  virtual int hidden2() { return -2; }
  virtual int b() = 0;
  virtual int c() = 0;
};
struct Impl : Base {
  ~Impl() override;
  int a() override;
  int b() override;
  int c() override;
};
Impl::~Impl() {}
int Impl::a() { return 1; }
int Impl::b() { return 2; }
int Impl::c() { return 3; }
}  // namespace mock

extern "C" void *mock_make() { return new mock::Impl(); }
extern "C" void mock_destroy(void *o) { delete static_cast<mock::Base *>(o); }
extern "C" int mock_call(void *o, int which) {
  auto *b = static_cast<mock::Base *>(o);
  switch (which) {
    case 0: return b->a();
    case 1: return b->hidden1();
    case 2: return b->hidden2();
    case 3: return b->b();
    default: return b->c();
  }
}
