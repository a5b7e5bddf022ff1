// Encoding throughput of the hf_tokenizer library on one thread, for tools/bench/tokenizer_bench.py
// to set beside Python's `tokenizers` on the same files:
//
//   tokenizer_bench [--rounds N] TOKENIZER FILE...
//
// encodes every FILE (each one whole text, as Python's `tokenizer.encode(text)`, special tokens
// added) once to warm up, then N rounds (default 5), and prints one line:
//   trainyard files=<n> bytes=<b> tokens=<t> seconds=<best round> mb_per_s=<b / best / 1e6>
// The token count lets the caller check that both sides produced the same number of ids.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "load_tokenizer.hpp"

namespace {

struct Arguments {
  int rounds = 5;
  std::string tokenizer;
  std::vector<std::string> files;
};

Arguments parse_arguments(int argc, char** argv) {
  Arguments arguments;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--rounds" && i + 1 < argc) {
      arguments.rounds = std::atoi(argv[++i]);
      if (arguments.rounds < 1) throw std::runtime_error("--rounds must be at least 1");
    } else {
      positional.push_back(argument);
    }
  }
  if (positional.size() < 2)
    throw std::runtime_error("usage: tokenizer_bench [--rounds N] TOKENIZER FILE...");
  arguments.tokenizer = positional.front();
  arguments.files.assign(positional.begin() + 1, positional.end());
  return arguments;
}

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error(path + ": cannot read");
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// Encodes every text once; returns the number of ids.
std::size_t encode_all(const trainyard::Tokenizer& tokenizer,
                       const std::vector<std::string>& texts) {
  std::size_t tokens = 0;
  for (const std::string& text : texts) tokens += tokenizer.encode(text).size();
  return tokens;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Arguments arguments = parse_arguments(argc, argv);
    const auto tokenizer = trainyard::load_tokenizer(arguments.tokenizer);
    std::vector<std::string> texts;
    std::size_t bytes = 0;
    for (const std::string& path : arguments.files) {
      texts.push_back(read_file(path));
      bytes += texts.back().size();
    }
    // The warm-up round fills the word cache, as the Python side's warm-up fills its own.
    const std::size_t tokens = encode_all(*tokenizer, texts);
    double best = std::numeric_limits<double>::infinity();
    for (int round = 0; round < arguments.rounds; ++round) {
      const auto start = std::chrono::steady_clock::now();
      if (encode_all(*tokenizer, texts) != tokens)
        throw std::runtime_error("the rounds disagree on the number of tokens");
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      if (took.count() < best) best = took.count();
    }
    std::printf("trainyard files=%zu bytes=%zu tokens=%zu seconds=%.6f mb_per_s=%.3f\n",
                texts.size(), bytes, tokens, best, static_cast<double>(bytes) / best / 1e6);
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "tokenizer_bench: " << error.what() << "\n";
    return 1;
  }
}
