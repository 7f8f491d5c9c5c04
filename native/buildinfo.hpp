// Compile-time facts about the native core, reported by `eva --version`.
#pragma once

namespace eva {
const char* compiler_id();
int cxx_standard();
}  // namespace eva
