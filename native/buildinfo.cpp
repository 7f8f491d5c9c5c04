#include "buildinfo.hpp"

namespace eva {
const char* compiler_id() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "gcc " __VERSION__;
#else
  return "unknown";
#endif
}
int cxx_standard() { return static_cast<int>(__cplusplus / 100 % 100); }
}  // namespace eva
