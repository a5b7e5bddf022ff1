#pragma once
// The plugin ABI: one C entry point per library returning a plain descriptor.
//
//   void register_components(trainyard::Registry& registry) {
//     registry.add<trainyard::Model>("my_model", options, "what it is", make_my_model);
//   }
//   TRAINYARD_PLUGIN("my_model", "1.0.0", register_components)

#include <boost/dll/alias.hpp>

#include <cstdint>

#include "trainyard/api/build_context.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/api/version.hpp"

namespace trainyard {

// The layout is frozen for a given TRAINYARD_ABI_VERSION; `abi_version` comes first so that the
// host can read it from any version of the struct before trusting the rest.
struct PluginDescriptor {
  std::uint32_t abi_version;
  const char* name;
  const char* version;
  const char* build_tag;
  void (*register_components)(Registry& registry);
};

using PluginEntryPoint = const PluginDescriptor*();

// The exported symbol every plugin library defines (through TRAINYARD_PLUGIN).
inline constexpr const char* kPluginEntryPoint = "trainyard_plugin_descriptor";

}  // namespace trainyard

#define TRAINYARD_PLUGIN(NAME, VERSION, REGISTER)                                              \
  namespace {                                                                                  \
  const ::trainyard::PluginDescriptor* trainyard_describe_plugin() {                          \
    static const ::trainyard::PluginDescriptor descriptor{TRAINYARD_ABI_VERSION, NAME, VERSION, \
                                                          TRAINYARD_BUILD_TAG, &REGISTER};    \
    return &descriptor;                                                                        \
  }                                                                                            \
  }                                                                                            \
  BOOST_DLL_ALIAS(trainyard_describe_plugin, trainyard_plugin_descriptor)
