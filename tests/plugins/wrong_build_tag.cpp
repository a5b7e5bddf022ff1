// A plugin built against another LibTorch: the host must refuse it before calling it.

#include "trainyard/api/plugin.hpp"

namespace {
void never_called(trainyard::Registry&) { std::abort(); }
const trainyard::PluginDescriptor* describe() {
  static const trainyard::PluginDescriptor descriptor{
      TRAINYARD_ABI_VERSION, "wrong_build_tag", "1.0.0", "libtorch 1.13.1, gxx-abi 1013, cxx11-abi 0",
      &never_called};
  return &descriptor;
}
}  // namespace

BOOST_DLL_ALIAS(describe, trainyard_plugin_descriptor)
