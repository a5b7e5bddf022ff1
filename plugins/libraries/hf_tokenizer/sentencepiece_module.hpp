#pragma once
// SentencePiece .model files are read by libsentencepiece in a module of its own
// (libtrainyard_sentencepiece.so), loaded only when such a file is opened and bound to its own
// symbols first (RTLD_DEEPBIND). libsentencepiece exports gflags-style globals
// (FLAGS_minloglevel) that LibTorch's c10 also exports with another type: linked into a process
// that already holds c10, its static initialisers write over c10's flags, and the next failed
// CAFFE_ENFORCE in LibTorch aborts the process instead of throwing. Processes that never open a
// .model file never load it.

#include <filesystem>
#include <memory>
#include <string>

#include "tokenizer.hpp"

namespace trainyard {

// The module's entry point: a new tokenizer for the file, or null with `error` filled.
using OpenSentencePieceModel = Tokenizer* (*)(const char* path, std::string* error);

// Throws std::runtime_error naming the file when the module is missing or the model does not load.
std::unique_ptr<Tokenizer> open_sentencepiece_model(const std::filesystem::path& path);

}  // namespace trainyard
