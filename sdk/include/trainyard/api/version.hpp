#pragma once
// Versions a plugin is checked against before any of its code runs.

#include <torch/headeronly/version.h>

#include <cstdint>

#define TRAINYARD_STRINGIFY_IMPL(x) #x
#define TRAINYARD_STRINGIFY(x) TRAINYARD_STRINGIFY_IMPL(x)

// Bumped whenever a field of PluginDescriptor, a virtual function of an SDK interface or the
// layout of a type crossing the plugin boundary changes.
#define TRAINYARD_ABI_VERSION 17

// What a plugin must share with the host to exchange C++ objects: LibTorch's version and the
// compiler's C++ ABI (Itanium ABI level and libstdc++'s string/list ABI).
#define TRAINYARD_BUILD_TAG                                                    \
  "libtorch " TRAINYARD_STRINGIFY(TORCH_VERSION_MAJOR) "." TRAINYARD_STRINGIFY( \
      TORCH_VERSION_MINOR) "." TRAINYARD_STRINGIFY(TORCH_VERSION_PATCH)         \
      ", gxx-abi " TRAINYARD_STRINGIFY(__GXX_ABI_VERSION) ", cxx11-abi " TRAINYARD_STRINGIFY( \
          _GLIBCXX_USE_CXX11_ABI)

namespace trainyard {

inline constexpr std::uint32_t kAbiVersion = TRAINYARD_ABI_VERSION;
inline constexpr const char* kBuildTag = TRAINYARD_BUILD_TAG;
inline constexpr const char* kFrameworkVersion = "0.1.0";

}  // namespace trainyard
