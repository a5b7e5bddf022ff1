// Token shards on disk (the format is documented in token_shards.hpp and README.md), read through
// mmap as fixed-length language-modelling windows: a streaming "train" split sharded across
// ranks and loader workers, and a held-out map-style "test" split.

#include "token_shards.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

std::unique_ptr<Dataset> make_tokens(const Config& options) {
  const auto pattern = options.get_path("path");
  if (pattern.empty()) options.fail("path", "must name a glob of token shard files");
  token_shards::CorpusOptions corpus;
  corpus.seq_len = options.get_int("seq_len");
  corpus.vocab_size = options.get_int("vocab_size");
  corpus.eval_every = options.get_int("eval_every");
  auto shards = token_shards::expand_glob(pattern, options.qualified("path"));
  return std::make_unique<token_shards::TokenDataset>(
      std::make_shared<token_shards::TokenCorpus>(shards, corpus));
}

void register_components(Registry& registry) {
  registry.add<Dataset>(
      "tokens",
      {required_option("path", OptionType::kString,
                       "glob of token shard files (read in sorted order)"),
       option("seq_len", 128, "tokens per window (the model's sequence length)").at_least(1),
       option("vocab_size", 0, "vocabulary size (0: the largest the shard headers record)")
           .at_least(0),
       option("eval_every", 20, "hold out every N-th window as the test split (0: none)")
           .at_least(2)
           .or_exactly(0, "for no test split")},
      "memory-mapped token shards as language-modelling windows; streaming train split",
      [](const Config& options, const BuildContext&) { return make_tokens(options); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("tokens", "1.0.0", trainyard::register_components)
