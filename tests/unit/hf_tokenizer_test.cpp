// The hf_tokenizer library against Python: tokenizers trained offline on Debian's fortunes by
// tests/unit/hf_tokenizer/make_references.py (GPT-2's and Llama 3's byte-level BPE, Llama 2's
// byte-fallback BPE in three layouts, transformers' conversion of a SentencePiece model, and
// the SentencePiece .model itself), whose ids and decoded texts for every corpus file, every
// distinct line and the Unicode stress file must equal ours exactly. Then, without Python: a
// small BPE whose ids are worked out here, the Oniguruma meaning of the regex escapes that
// PCRE2 reads otherwise, and the refusals (tokenizer.json files made by hand, truncated,
// malformed), one line each naming the file and the problem.
//
// Built in the repository with the shared test support; standalone (no LibTorch) with
// -DTRAINYARD_HF_TOKENIZER_STANDALONE, -DTRAINYARD_SOURCE_DIR=... and -DTRAINYARD_VENV_PYTHON=...

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "load_tokenizer.hpp"
#include "regex.hpp"
#include "tokenizer_json.hpp"

#ifndef TRAINYARD_HF_TOKENIZER_STANDALONE
#include <c10/util/Logging.h>

#include "test_support.hpp"
#else
// What the shared test support gives this file, for a build without LibTorch.
namespace trainyard::testing {
inline bool strict_mode() {
  const char* value = std::getenv("TRAINYARD_STRICT");
  return value != nullptr && std::string(value) == "1";
}
inline std::filesystem::path source_dir() { return TRAINYARD_SOURCE_DIR; }
}  // namespace trainyard::testing
#define TRAINYARD_SKIP_MISSING()                                                               \
  return GTEST_MESSAGE_(::trainyard::testing::strict_mode()                                    \
                            ? "strict mode (TRAINYARD_STRICT=1) fails what would be skipped: " \
                              "the environment lacks what this test needs"                     \
                            : "the environment lacks what this test needs",                    \
                        ::trainyard::testing::strict_mode()                                    \
                            ? ::testing::TestPartResult::kFatalFailure                         \
                            : ::testing::TestPartResult::kSkip)
#endif

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using Ids = std::vector<std::uint32_t>;

fs::path venv_python() {
#ifdef TRAINYARD_VENV_PYTHON
  return TRAINYARD_VENV_PYTHON;
#else
  return source_dir() / ".venv" / "bin" / "python";
#endif
}

std::string read_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

fs::path fresh_folder(const std::string& stem) {
  std::random_device random;
  for (int attempt = 0; attempt < 100; ++attempt) {
    fs::path candidate = fs::temp_directory_path() / (stem + std::to_string(random()));
    if (fs::create_directory(candidate)) return candidate;
  }
  throw std::runtime_error("cannot create a temporary folder");
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = text.find('\n', begin);
    lines.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return lines;
    begin = end + 1;
  }
}

// The Python side, made once per test process: the tokenizer files, the manifest, and each
// tokenizer's reference ids. `missing` says why it could not be made when the environment
// lacks something (no venv, no package, no corpus); `error` when the script failed otherwise.
struct References {
  fs::path folder;
  std::string missing, error;
  Json manifest;
  std::vector<std::string> texts;  // the corpus files and the stress file, read here
  bool keep = false;
  ~References() {
    std::error_code ignored;
    if (!folder.empty() && !keep) fs::remove_all(folder, ignored);
  }
};

const References& references() {
  static const std::unique_ptr<References> made = [] {
    auto refs = std::make_unique<References>();
    // A folder the script made before, kept between runs while working on the library.
    if (const char* kept = std::getenv("TRAINYARD_HF_TOKENIZER_REFERENCES");
        kept && fs::exists(fs::path(kept) / "manifest.json")) {
      refs->folder = kept;
      refs->keep = true;
      refs->manifest = Json::parse(read_file(refs->folder / "manifest.json"));
      for (const auto& path : refs->manifest["texts"]) refs->texts.push_back(read_file(path));
      return refs;
    }
    const fs::path python = venv_python();
    if (!fs::exists(python)) {
      refs->missing = "no " + python.string() + " (run tools/setup --tests)";
      return refs;
    }
    refs->folder = fresh_folder("hf-tokenizer-test-");
    const fs::path script = source_dir() / "tests/unit/hf_tokenizer/make_references.py";
    const fs::path stress = source_dir() / "tests/data/unicode_stress.txt";
    const fs::path log = refs->folder / "python.log";
    std::ostringstream command_line;  // a stream: GCC 12 misreads the chain of string + here
    command_line << '\'' << python.string() << "' '" << script.string() << "' '"
                 << refs->folder.string() << "' '" << stress.string() << "' > '" << log.string()
                 << "' 2>&1";
    const std::string command = command_line.str();
    const int status = std::system(command.c_str());
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (code == 77) {
      refs->missing = read_file(log);
    } else if (code != 0) {
      refs->error = "make_references.py exited " + std::to_string(code) + ":\n" + read_file(log);
    } else {
      refs->manifest = Json::parse(read_file(refs->folder / "manifest.json"));
      for (const auto& path : refs->manifest["texts"]) refs->texts.push_back(read_file(path));
    }
    return refs;
  }();
  return *made;
}

// "ids differ at 3 of 10 (ours [.. 1 2 ..], Python's [.. 1 5 ..])", or empty when equal.
std::string difference(const Ids& ours, const Ids& theirs) {
  if (ours == theirs) return {};
  std::size_t at = 0;
  while (at < ours.size() && at < theirs.size() && ours[at] == theirs[at]) ++at;
  const auto around = [&](const Ids& ids) {
    std::string out = "[";
    for (std::size_t i = at >= 3 ? at - 3 : 0; i < std::min(ids.size(), at + 4); ++i)
      out += std::to_string(ids[i]) + (i == at ? "* " : " ");
    return out + "]";
  };
  return "ids differ at " + std::to_string(at) + " (ours " + std::to_string(ours.size()) + " " +
         around(ours) + ", Python's " + std::to_string(theirs.size()) + " " + around(theirs) + ")";
}

class AgreesWithPython : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const References& refs = references();
    if (!refs.missing.empty()) TRAINYARD_SKIP_MISSING() << refs.missing;
    ASSERT_TRUE(refs.error.empty()) << refs.error;
    const std::string file = refs.manifest["tokenizers"][GetParam()].get<std::string>();
    tokenizer_ = load_tokenizer(refs.folder / file);
    reference_ = Json::parse(read_file(refs.folder / (GetParam() + ".reference.json")));
  }
  std::unique_ptr<Tokenizer> tokenizer_;
  Json reference_;
};

TEST_P(AgreesWithPython, OnEveryWholeTextAndItsDecoding) {
  const References& refs = references();
  EXPECT_EQ(tokenizer_->vocab_size(), reference_["vocab_size"].get<std::size_t>());
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < refs.texts.size(); ++i) {
    const std::string& name = refs.manifest["texts"][i].get_ref<const std::string&>();
    const Ids ids = tokenizer_->encode(refs.texts[i]);
    EXPECT_EQ(difference(ids, reference_["text_ids"][i].get<Ids>()), "") << name;
    EXPECT_EQ(tokenizer_->decode(ids), reference_["text_decoded"][i].get<std::string>()) << name;
    bytes += refs.texts[i].size();
  }
  EXPECT_GT(bytes, 2'000'000u) << "the whole corpus and the stress file";
}

TEST_P(AgreesWithPython, OnEveryDistinctLine) {
  const auto& lines = references().manifest["lines"];
  const auto& expected = reference_["line_ids"];
  ASSERT_EQ(lines.size(), expected.size());
  std::size_t wrong = 0;
  Ids ids;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    ids.clear();
    tokenizer_->encode_into(lines[i].get_ref<const std::string&>(), SpecialTokens::add, ids);
    const std::string diff = difference(ids, expected[i].get<Ids>());
    if (diff.empty()) continue;
    if (++wrong <= 5) ADD_FAILURE() << "line " << i << " " << lines[i].dump() << ": " << diff;
  }
  EXPECT_EQ(wrong, 0u) << "of " << lines.size() << " lines";
}

TEST_P(AgreesWithPython, OnStressLinesWithoutSpecialTokensAndDecodingThem) {
  const std::string stress = read_file(source_dir() / "tests/data/unicode_stress.txt");
  const std::vector<std::string> lines = split_lines(stress);
  ASSERT_EQ(lines.size(), reference_["stress_line_ids_plain"].size());
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const Ids plain = tokenizer_->encode(lines[i], SpecialTokens::omit);
    EXPECT_EQ(difference(plain, reference_["stress_line_ids_plain"][i].get<Ids>()), "")
        << "stress line " << i;
    EXPECT_EQ(tokenizer_->decode(tokenizer_->encode(lines[i]), SkipSpecial::no),
              reference_["stress_line_decoded_with_special"][i].get<std::string>())
        << "stress line " << i;
  }
}

TEST_P(AgreesWithPython, DecodesWithoutSpecialTokensAndByteLevelRoundTrips) {
  // Byte-level BPE without a prefix space loses nothing: decode(encode(text)) is the text itself
  // (without the BOS the template adds, with the special tokens the text has), except where
  // Llama 3's <mask> (lstrip) and @@ (rstrip) take the white space beside them: the stress file.
  const References& refs = references();
  const bool byte_level = GetParam() == "gpt2" || GetParam() == "llama3";
  for (std::size_t i = 0; i < refs.texts.size(); ++i) {
    const std::string& name = refs.manifest["texts"][i].get_ref<const std::string&>();
    const std::string decoded =
        tokenizer_->decode(tokenizer_->encode(refs.texts[i], SpecialTokens::omit), SkipSpecial::no);
    EXPECT_TRUE(decoded == reference_["text_decoded_plain"][i].get<std::string>()) << name;
    const bool stripped = GetParam() == "llama3" && i + 1 == refs.texts.size();
    if (byte_level && !stripped) {
      EXPECT_TRUE(decoded == refs.texts[i]) << name;
    }
  }
}

TEST_P(AgreesWithPython, FromSeveralThreadsAtOnce) {
  // Each thread encodes every text, starting at a different one, all against one tokenizer.
  const References& refs = references();
  std::vector<std::thread> threads;
  std::vector<std::size_t> wrong(2, 0);
  for (std::size_t t = 0; t < wrong.size(); ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t k = 0; k < refs.texts.size(); ++k) {
        const std::size_t i = (k + t) % refs.texts.size();
        if (tokenizer_->encode(refs.texts[i]) != reference_["text_ids"][i].get<Ids>()) ++wrong[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong[0] + wrong[1], 0u);
}

INSTANTIATE_TEST_SUITE_P(HfTokenizer, AgreesWithPython,
                         ::testing::Values("gpt2", "gpt2_prefix_space", "llama3", "llama2",
                                           "llama2_unk", "llama2_metaspace", "llama_converted",
                                           "spm"));

// A byte-fallback BPE small enough to work out by hand: "b c" outranks "a b", so "abc" is
// a + bc (no merge makes abc from those); é is not in the vocab, so its UTF-8 bytes C3 A9 are
// tokens; a run of unknown characters is one <unk> (fuse_unk); the template puts <s> first.
Json small_tokenizer() {
  return Json::parse(R"json({
    "version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [{"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
                      "rstrip": false, "normalized": false, "special": true}],
    "normalizer": null, "pre_tokenizer": null,
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}},
    "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
    "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
      "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
      "byte_fallback": true, "ignore_merges": false,
      "vocab": {"<s>": 0, "<unk>": 1, "<0xC3>": 2, "<0xA9>": 3, "a": 4, "b": 5, "c": 6, "ab": 7,
                "bc": 8, "abc": 9},
      "merges": [["b", "c"], ["a", "b"], ["ab", "c"]]}
  })json");
}

TEST(HfTokenizerByHand, EncodesASmallBpeAsWorkedOut) {
  const auto tokenizer = parse_tokenizer_json(small_tokenizer().dump(), "small.json");
  EXPECT_EQ(tokenizer->vocab_size(), 10u);
  EXPECT_EQ(tokenizer->bos_id(), 0u);
  EXPECT_EQ(tokenizer->encode("abc"), (Ids{0, 4, 8}));
  EXPECT_EQ(tokenizer->encode("abab", SpecialTokens::omit), (Ids{7, 7}));
  EXPECT_EQ(tokenizer->encode("abc\xC3\xA9", SpecialTokens::omit), (Ids{4, 8, 2, 3}));
  EXPECT_EQ(tokenizer->encode("xyab", SpecialTokens::omit), (Ids{1, 7}));
  EXPECT_EQ(tokenizer->encode("ab c", SpecialTokens::omit), (Ids{7, 1, 6}));
  EXPECT_EQ(tokenizer->encode("ab<s>c", SpecialTokens::omit), (Ids{7, 0, 6}));
  EXPECT_EQ(tokenizer->encode(""), (Ids{0}));
  EXPECT_EQ(tokenizer->encode("", SpecialTokens::omit), Ids{});
}

TEST(HfTokenizerByHand, DecodesASmallBpeAsWorkedOut) {
  const auto tokenizer = parse_tokenizer_json(small_tokenizer().dump(), "small.json");
  EXPECT_EQ(tokenizer->decode(Ids{0, 4, 8, 2, 3}), "abc\xC3\xA9");
  EXPECT_EQ(tokenizer->decode(Ids{0, 4, 8, 2, 3}, SkipSpecial::no), "<s>abc\xC3\xA9");
  EXPECT_EQ(tokenizer->decode(Ids{7, 1, 6}), "ab<unk>c");
  EXPECT_EQ(tokenizer->decode(Ids{2, 4}),
            "\xEF\xBF\xBD"
            "a")
      << "a lone byte is U+FFFD";
  EXPECT_EQ(tokenizer->decode(Ids{4, 99, 5}), "ab") << "ids outside the vocabulary are skipped";
}

TEST(HfTokenizerByHand, RefusesTextThatIsNotUtf8) {
  const auto tokenizer = parse_tokenizer_json(small_tokenizer().dump(), "small.json");
  try {
    tokenizer->encode("ab\xC3(");
    ADD_FAILURE() << "invalid UTF-8 was encoded";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("not valid UTF-8 at byte 2"), std::string::npos)
        << error.what();
  }
}

// Every match of `pattern` in `text`.
std::vector<std::string> matches(const std::string& pattern, const std::string& text) {
  const Regex regex(pattern);
  RegexScratch scratch;
  std::vector<std::string> found;
  regex.for_each_match(text, scratch, [&](std::size_t begin, std::size_t end) {
    found.push_back(text.substr(begin, end - begin));
  });
  return found;
}

TEST(HfTokenizerRegex, SpeaksOnigurumasDialect) {
  using Found = std::vector<std::string>;
  // \s is White_Space: U+0085 and U+3000 are, U+180E (PCRE2's \s takes it) and U+200B are not.
  EXPECT_EQ(matches(R"(\s+)", "a\u180Eb\u0085c\u3000d\u200Be f"), (Found{"\u0085", "\u3000", " "}));
  EXPECT_EQ(matches(R"([^\s\p{L}]+)", "a\u180E!\u0085b"), (Found{"\u180E!"}));
  EXPECT_EQ(matches(R"(\S+)", "\u180E \u2028x"), (Found{"\u180E", "x"}));
  // \v is the vertical tab alone; \uHHHH a code point.
  EXPECT_EQ(matches(R"(\v)", "\n\v\f"), (Found{"\v"}));
  EXPECT_EQ(matches(R"(\u00E9+)", "caf\u00E9\u00E9"), (Found{"\u00E9\u00E9"}));
  // Case-insensitive contractions fold as Oniguruma folds (the long s is an s).
  EXPECT_EQ(matches(R"((?i:'s))", "'S '\u017F 'x"), (Found{"'S", "'\u017F"}));
  // ^ and $ at every line, \r not a line end.
  EXPECT_EQ(matches(R"(^a|b$)", "a\r\nab\nb\r"), (Found{"a", "a", "b"}));
  // An empty match right after a match is skipped, as the onig crate's find_iter skips it.
  EXPECT_EQ(matches(R"(x*)", "axxb"), (Found{"", "xx", ""}));
}

// A folder of files written by a test, removed with them.
struct ScratchFolder {
  fs::path path = fresh_folder("hf-tokenizer-refusals-");
  ~ScratchFolder() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return path / name;
  }
};

// The message load_tokenizer refuses `file` with; empty (and a failure) when it loads.
std::string refusal(const fs::path& file) {
  try {
    load_tokenizer(file);
  } catch (const std::runtime_error& error) {
    return error.what();
  }
  ADD_FAILURE() << file << " was not refused";
  return {};
}

std::string refusal_of_text(const std::string& text, const std::string& name) {
  try {
    parse_tokenizer_json(text, name);
  } catch (const std::runtime_error& error) {
    return error.what();
  }
  ADD_FAILURE() << name << " was not refused";
  return {};
}

// One line that begins with the file's name and says `problem`.
::testing::AssertionResult names_file_and_problem(const std::string& message,
                                                  const std::string& file,
                                                  const std::string& problem) {
  if (message.find('\n') != std::string::npos)
    return ::testing::AssertionFailure() << "more than one line: " << message;
  if (message.rfind(file, 0) != 0)
    return ::testing::AssertionFailure() << "does not begin with " << file << ": " << message;
  if (message.find(problem) == std::string::npos)
    return ::testing::AssertionFailure() << "does not say " << problem << ": " << message;
  return ::testing::AssertionSuccess();
}

TEST(HfTokenizerRefuses, ModelTypesOtherThanBpe) {
  const ScratchFolder folder;
  for (const std::string type : {"WordPiece", "Unigram", "WordLevel"}) {
    Json tokenizer = small_tokenizer();
    tokenizer["model"]["type"] = type;
    const fs::path file = folder.write(type + ".json", tokenizer.dump(2));
    EXPECT_TRUE(names_file_and_problem(refusal(file), file.string(),
                                       ": model type \"" + type + "\" is not supported"));
  }
}

TEST(HfTokenizerRefuses, MalformedJsonWithItsPlace) {
  const ScratchFolder folder;
  const fs::path file = folder.write("malformed.json", "{\n  \"version\": \"1.0\",,\n}\n");
  EXPECT_TRUE(names_file_and_problem(refusal(file),
                                     file.string() + ":2:", ": not valid JSON: syntax error"));
  const fs::path empty = folder.write("empty.json", "");
  EXPECT_TRUE(names_file_and_problem(refusal(empty), empty.string(), ": the file is empty"));
}

TEST(HfTokenizerRefuses, TruncatedFilesWhereverTheyAreCut) {
  const ScratchFolder folder;
  const std::string whole = small_tokenizer().dump(2);
  const fs::path file = folder.write("truncated.json", whole.substr(0, whole.size() / 2));
  EXPECT_TRUE(names_file_and_problem(refusal(file), file.string(),
                                     ": the JSON ends before it is complete"));
  // Every shorter prefix that is not blank: cut in a string, a number, a literal, between
  // tokens.
  const std::size_t first = whole.find_first_not_of(" \n");
  for (std::size_t size = first + 1; size < whole.size(); ++size) {
    const std::string message = refusal_of_text(whole.substr(0, size), "cut.json");
    ASSERT_TRUE(
        names_file_and_problem(message, "cut.json", ": the JSON ends before it is complete"))
        << "cut at byte " << size;
  }
}

TEST(HfTokenizerRefuses, ComponentsItDoesNotImplement) {
  const std::vector<std::tuple<std::string, Json, std::string>> cases = {
      {"/normalizer", Json::parse(R"({"type": "NFKC"})"),
       "normalizer type \"NFKC\" is not supported"},
      {"/normalizer",
       Json::parse(R"({"type": "Sequence", "normalizers": [{"type": "Lowercase"}]})"),
       "normalizer.normalizers[0] type \"Lowercase\" is not supported"},
      {"/pre_tokenizer", Json::parse(R"({"type": "Whitespace"})"),
       "pre_tokenizer type \"Whitespace\" is not supported"},
      {"/decoder", Json::parse(R"({"type": "WordPiece", "prefix": "##", "cleanup": true})"),
       "decoder type \"WordPiece\" is not supported"},
      {"/post_processor", Json::parse(R"({"type": "RobertaProcessing"})"),
       "post_processor type \"RobertaProcessing\" is not supported"},
      {"/model/dropout", 0.1, "model.dropout is not supported"},
      {"/model/continuing_subword_prefix", "##", "model.continuing_subword_prefix \"##\""},
      {"/truncation", Json::parse(R"({"max_length": 8})"), "truncation is not supported"},
      {"/model/merges/2", Json::array({"ab", "x"}), "token \"x\" is not in the vocab"},
      {"/version", "2.0", "version \"2.0\" is not supported"},
      {"/pre_tokenizer",
       Json::parse(R"({"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated",
                       "invert": false})"),
       "pre_tokenizer.pattern.Regex: regex '\\w+': \\w (word characters) is not supported"},
  };
  for (const auto& [pointer, value, problem] : cases) {
    Json tokenizer = small_tokenizer();
    tokenizer[Json::json_pointer(pointer)] = value;
    EXPECT_TRUE(
        names_file_and_problem(refusal_of_text(tokenizer.dump(), "t.json"), "t.json: ", problem))
        << pointer;
  }
}

TEST(HfTokenizerRefuses, MissingFilesAndOtherKindsOfFile) {
  const ScratchFolder folder;
  const fs::path missing = folder.path / "missing.json";
  EXPECT_TRUE(names_file_and_problem(refusal(missing), missing.string(), ": cannot read"));
  const fs::path model = folder.write("broken.model", "\x0a\x05 not a model");
  EXPECT_TRUE(
      names_file_and_problem(refusal(model), model.string(), ": not a SentencePiece model"));
  const fs::path vocab = folder.write("vocab.txt", "a 0\n");
  EXPECT_TRUE(names_file_and_problem(refusal(vocab), vocab.string(), ": not a tokenizer file"));
}

#ifndef TRAINYARD_HF_TOKENIZER_STANDALONE
// libsentencepiece and LibTorch's c10 export globals of one name and two types
// (FLAGS_minloglevel): a .model opened in a process that holds LibTorch must leave LibTorch's
// failed checks throwing, not aborting the process (sentencepiece_module.hpp). The model is a
// small one Python's sentencepiece trains here.
TEST(HfTokenizerSentencePiece, LeavesLibTorchErrorsThrowing) {
  const fs::path python = venv_python();
  if (!fs::exists(python)) TRAINYARD_SKIP_MISSING() << "no " << python;
  const ScratchFolder folder;
  std::string corpus;
  for (int i = 0; i < 200; ++i) corpus += "a line of text number " + std::to_string(i) + "\n";
  const fs::path text = folder.write("corpus.txt", corpus);
  const std::string train =
      "import sentencepiece as s, sys; s.SentencePieceTrainer.train(input=sys.argv[1], "
      "model_prefix=sys.argv[2], vocab_size=40, model_type='bpe', minloglevel=2)";
  const std::string command = "'" + python.string() + "' -c \"" + train + "\" '" + text.string() +
                              "' '" + (folder.path / "small").string() + "'";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const auto tokenizer = load_tokenizer(folder.path / "small.model");
  EXPECT_FALSE(tokenizer->encode("a line of text").empty());
  EXPECT_THROW(CAFFE_ENFORCE(false, "a failed check"), c10::Error);
}
#endif

}  // namespace
}  // namespace trainyard::testing
