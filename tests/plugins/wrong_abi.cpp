// A plugin that claims a future SDK ABI version: the host must refuse it before calling it.

#include "trainyard/api/plugin.hpp"

namespace {
void never_called(trainyard::Registry&) { std::abort(); }
const trainyard::PluginDescriptor* describe() {
  static const trainyard::PluginDescriptor descriptor{TRAINYARD_ABI_VERSION + 1, "wrong_abi",
                                                      "1.0.0", TRAINYARD_BUILD_TAG, &never_called};
  return &descriptor;
}
}  // namespace

BOOST_DLL_ALIAS(describe, trainyard_plugin_descriptor)
