// The jaxlib version whose FFI headers the kernels were compiled against
// (setup.py defines it), read by jaxsparse_rows/_native/__init__.py before it
// registers any handler: XLA refuses handlers built with a newer FFI API than
// its own, and a refused registration stops its CPU backend from starting.

#ifndef JSR_BUILT_WITH_JAXLIB
#define JSR_BUILT_WITH_JAXLIB "unknown"
#endif

extern "C" const char* jsr_built_with_jaxlib() { return JSR_BUILT_WITH_JAXLIB; }
