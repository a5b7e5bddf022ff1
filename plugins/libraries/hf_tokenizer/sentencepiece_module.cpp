#include "sentencepiece_module.hpp"

#include <dlfcn.h>

#include <mutex>
#include <stdexcept>
#include <vector>

namespace trainyard {
namespace {

constexpr const char* kModuleFile = "libtrainyard_sentencepiece.so";
constexpr const char* kEntryPoint = "trainyard_open_sentencepiece_model";

// Where the module may be: beside the plugins folder of the plugin or program this code is
// linked into (the installed and the build layout alike), then where this build wrote it.
std::vector<std::filesystem::path> module_candidates() {
  std::vector<std::filesystem::path> candidates;
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&open_sentencepiece_model), &self) != 0 &&
      self.dli_fname != nullptr) {
    const auto directory = std::filesystem::path(self.dli_fname).parent_path();
    candidates.push_back(directory.parent_path() / kModuleFile);
  }
  candidates.emplace_back(TRAINYARD_SENTENCEPIECE_MODULE_BUILD_PATH);
  return candidates;
}

OpenSentencePieceModel load_entry_point(const std::filesystem::path& model_path) {
  std::string looked_in;
  for (const auto& candidate : module_candidates()) {
    if (!std::filesystem::exists(candidate)) {
      looked_in += (looked_in.empty() ? "" : ", ") + candidate.string();
      continue;
    }
    // Never closed: the tokenizers it creates keep pointing into it.
    void* module = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (module == nullptr)
      throw std::runtime_error(model_path.string() + ": cannot load " + candidate.string() + ": " +
                               dlerror());
    void* entry = dlsym(module, kEntryPoint);
    if (entry == nullptr)
      throw std::runtime_error(model_path.string() + ": " + candidate.string() + " has no " +
                               kEntryPoint);
    return reinterpret_cast<OpenSentencePieceModel>(entry);
  }
  throw std::runtime_error(model_path.string() + ": reading SentencePiece models needs " +
                           kModuleFile + ", which is not in " + looked_in);
}

}  // namespace

std::unique_ptr<Tokenizer> open_sentencepiece_model(const std::filesystem::path& path) {
  static std::once_flag loaded;
  static OpenSentencePieceModel open = nullptr;
  std::call_once(loaded, [&] { open = load_entry_point(path); });
  std::string error;
  Tokenizer* tokenizer = open(path.c_str(), &error);
  if (tokenizer == nullptr) throw std::runtime_error(error);
  return std::unique_ptr<Tokenizer>(tokenizer);
}

}  // namespace trainyard
