// The strict JSON reader over nlohmann::json: what it reads exactly (64-bit integers), what it
// refuses that nlohmann's own parser accepts (repeated names, deep nesting, a byte order mark),
// and the one-line errors naming the source and the byte.

#include "trainyard/support/strict_json.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "test_support.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/support/json_quote.hpp"

namespace trainyard::testing {
namespace {

TEST(StrictJsonTest, ReadsEveryKindOfValue) {
  const nlohmann::json value = parse_strict_json(
      R"( {"a": [1, -2.5e3, true, false, null], "b": {"c": "d\n\u00e9\ud83d\ude00"}} )", "test");
  ASSERT_TRUE(value.is_object());
  const auto& items = value.at("a");
  ASSERT_EQ(items.size(), 5u);
  EXPECT_EQ(items[0].get<int>(), 1);
  EXPECT_EQ(items[1].get<double>(), -2500);
  EXPECT_TRUE(items[2].get<bool>());
  EXPECT_FALSE(items[3].get<bool>());
  EXPECT_TRUE(items[4].is_null());
  EXPECT_EQ(value.at("b").at("c").get<std::string>(), "d\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_FALSE(value.contains("missing"));
}

TEST(StrictJsonTest, IntegersReadExactlyAsSixtyFourBits) {
  const nlohmann::json value = parse_strict_json(
      R"({"max": 18446744073709551615, "above_2_53": 9007199254740993, "negative": -9007199254740993,
          "beyond": 18446744073709551616})",
      "test");
  ASSERT_TRUE(value.at("max").is_number_unsigned());
  EXPECT_EQ(value.at("max").get<std::uint64_t>(), std::numeric_limits<std::uint64_t>::max());
  // 2^53 + 1 has no double; read through one it would come back as 2^53.
  EXPECT_EQ(value.at("above_2_53").get<std::uint64_t>(), (std::uint64_t{1} << 53) + 1);
  ASSERT_TRUE(value.at("negative").is_number_integer());
  EXPECT_EQ(value.at("negative").get<std::int64_t>(), -(std::int64_t{1} << 53) - 1);
  // Beyond 64 bits a number is a double, which readers of sizes refuse.
  EXPECT_TRUE(value.at("beyond").is_number_float());
}

TEST(StrictJsonTest, ErrorsNameTheSourceAndByteOffset) {
  struct Case {
    const char* text;
    std::size_t byte;
    const char* reason;
  };
  // The byte is the one that cannot continue the text, or the text's length where it ends early.
  const Case cases[] = {
      Case{R"({"a": 1,})", 8, "expected string literal"},
      Case{R"({"a" 1})", 5, "expected ':'"},
      Case{R"([1 2])", 3, "expected ']'"},
      Case{R"("abc)", 4, "missing closing quote"},
      Case{R"(01)", 1, "expected end of input"},
      Case{R"(-)", 1, "expected digit after '-'"},
      Case{R"(1.)", 2, "expected digit after '.'"},
      Case{R"("\x")", 2, "forbidden character after backslash"},
      Case{R"("\ud800")", 7, "surrogate"},
      Case{"\"a\tb\"", 2, "control character"},
      Case{"\"\xff\"", 1, "ill-formed UTF-8"},
      Case{R"({"a": 1} x)", 9, "expected end of input"},
      Case{"", 0, "unexpected end of input"},
      Case{"tru", 3, "invalid literal"},
      Case{"NaN", 0, "invalid literal"},
      Case{"/* note */ 1", 0, "invalid literal"},
      Case{"1e400", 4, "number overflow"},
      Case{"\xEF\xBB\xBF{}", 0, "byte order mark"},
      Case{R"({"a": [1, }])", 10, "unexpected '}'"},
  };
  for (const Case& c : cases) {
    const std::string message = error_of([&] { parse_strict_json(c.text, "source.json"); });
    EXPECT_HAS(message, "source.json: invalid JSON at byte " + std::to_string(c.byte) + ": ");
    EXPECT_HAS(message, c.reason);
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(StrictJsonTest, RepeatedNamesInOneObjectAreRefused) {
  EXPECT_HAS(error_of([] { parse_strict_json(R"({"x": 1, "x": 2})", "f"); }),
             "f: invalid JSON at byte 11: duplicate entry 'x' in an object");
  EXPECT_HAS(error_of([] { parse_strict_json(R"([{"a": {"b": 1, "b": [2]}}])", "f"); }),
             "duplicate entry 'b'");
  // Names are compared after unescaping.
  EXPECT_HAS(error_of([] { parse_strict_json(R"({"x": 1, "\u0078": 2})", "f"); }),
             "duplicate entry 'x'");
  // The same name in different objects is fine.
  const nlohmann::json value =
      parse_strict_json(R"({"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]})", "f");
  EXPECT_EQ(value.at("b").at(1).at("a").get<int>(), 3);
}

TEST(StrictJsonTest, DepthIsBounded) {
  auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  EXPECT_NO_THROW(parse_strict_json(nested(kDefaultJsonDepth), "deep"));
  EXPECT_HAS(error_of([&] { parse_strict_json(nested(kDefaultJsonDepth + 1), "deep"); }),
             "deep: invalid JSON at byte 64: nested deeper than 64");
  EXPECT_HAS(error_of([&] { parse_strict_json(nested(100000), "deep"); }), "nested deeper than 64");
  EXPECT_NO_THROW(parse_strict_json(nested(200), "deep", 200));
  EXPECT_HAS(error_of([] { parse_strict_json(R"({"a": {"b": {}}})", "f", 2); }),
             "f: invalid JSON at byte 12: nested deeper than 2");
}

TEST(StrictJsonTest, ErrorsQuoteHostileInputShortly) {
  const std::string name(100000, 'n');
  const std::string message =
      error_of([&] { parse_strict_json("{\"" + name + "\": 1, \"" + name + "\": 2}", "f"); });
  EXPECT_HAS(message, "duplicate entry 'nnnn");
  EXPECT_LT(message.size(), 300u);
  const std::string bad_string = "\"" + name + "\x01\"";
  EXPECT_LT(error_of([&] { parse_strict_json(bad_string, "f"); }).size(), 300u);
}

TEST(StrictJsonTest, QuoteRoundTrips) {
  const std::string text = "a\"b\\c\nd\te\x01 \xce\xbb";
  EXPECT_EQ(json_quote("plain"), "\"plain\"");
  EXPECT_EQ(json_quote("a\"b\n\x01"), R"("a\"b\n\u0001")");
  EXPECT_EQ(parse_strict_json(json_quote(text), "q").get<std::string>(), text);
}

TEST(StrictJsonTest, QuotingInvalidUtf8IsAnError) {
  EXPECT_HAS(error_of([] { json_quote("name\xff"); }), "is not valid UTF-8");
}

}  // namespace
}  // namespace trainyard::testing
