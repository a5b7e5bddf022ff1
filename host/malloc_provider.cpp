#include "malloc_provider.hpp"

#include <dlfcn.h>

#include <filesystem>

namespace trainyard {

std::string malloc_provider() {
  // The dynamic linker binds every caller to the first malloc in the global scope: the one
  // preloaded, else the first library the host links that defines it.
  void* resolved = dlsym(RTLD_DEFAULT, "malloc");
  Dl_info info{};
  if (resolved == nullptr || dladdr(resolved, &info) == 0 || info.dli_fname == nullptr) {
    return "unknown";
  }
  return std::filesystem::path(info.dli_fname).filename().string();
}

}  // namespace trainyard
