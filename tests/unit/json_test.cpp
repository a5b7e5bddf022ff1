#include "trainyard/json.hpp"

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace trainyard::testing {
namespace {

TEST(JsonTest, ParsesEveryKindOfValue) {
  JsonValue value = parse_json(
      R"( {"a": [1, -2.5e3, true, false, null], "b": {"c": "d\n\u00e9\ud83d\ude00"}, "n": 18446744073709551615} )",
      "test");
  ASSERT_TRUE(value.is(JsonValue::Type::kObject));
  const auto& items = value.find("a")->as_array();
  ASSERT_EQ(items.size(), 5u);
  EXPECT_EQ(items[0].as_number(), 1);
  EXPECT_EQ(items[1].as_number(), -2500);
  EXPECT_TRUE(items[2].as_bool());
  EXPECT_FALSE(items[3].as_bool());
  EXPECT_TRUE(items[4].is(JsonValue::Type::kNull));
  EXPECT_EQ(value.find("b")->find("c")->as_string(), "d\n\xc3\xa9\xf0\x9f\x98\x80");
  // Large integers keep their spelling.
  EXPECT_EQ(value.find("n")->number_text(), "18446744073709551615");
  EXPECT_EQ(value.find("missing"), nullptr);
}

TEST(JsonTest, KeepsDuplicateMembersForReadersThatRefuseThem) {
  JsonValue value = parse_json(R"({"x": 1, "x": 2})", "test");
  EXPECT_EQ(value.as_object().size(), 2u);
}

TEST(JsonTest, ErrorsNameTheSourceAndByteOffset) {
  struct Case {
    const char* text;
    const char* reason;
  };
  for (const Case& c : {Case{R"({"a": 1,})", "expected a member name"},
                        Case{R"({"a" 1})", "expected ':'"},
                        Case{R"([1 2])", "expected ',' or ']'"},
                        Case{R"("abc)", "unterminated string"},
                        Case{R"(01)", "unexpected text after the value"},
                        Case{R"(-)", "unexpected character"},
                        Case{R"(1.)", "bad number"},
                        Case{R"("\x")", "bad escape"},
                        Case{R"("\ud800")", "unpaired surrogate"},
                        Case{"\"a\tb\"", "control character"},
                        Case{R"({"a": 1} x)", "unexpected text after the value"},
                        Case{"", "unexpected end"},
                        Case{"tru", "unexpected character"}}) {
    std::string message = error_of([&] { parse_json(c.text, "source.json"); });
    EXPECT_HAS(message, "source.json: invalid JSON at byte ");
    EXPECT_HAS(message, c.reason);
  }
  std::string message = error_of([] { parse_json(R"({"a": [1, }])", "f"); });
  EXPECT_HAS(message, "at byte 10");
}

TEST(JsonTest, DepthIsBounded) {
  std::string deep(100, '[');
  deep += std::string(100, ']');
  EXPECT_HAS(error_of([&] { parse_json(deep, "deep"); }), "nested deeper than 64");
  EXPECT_NO_THROW(parse_json(deep, "deep", 200));
}

TEST(JsonTest, QuoteRoundTrips) {
  const std::string text = "a\"b\\c\nd\te\x01 λ";
  EXPECT_EQ(json_quote("plain"), "\"plain\"");
  EXPECT_EQ(parse_json(json_quote(text), "q").as_string(), text);
}

TEST(JsonTest, WrongTypeAccessIsAnError) {
  JsonValue value = parse_json("[1]", "t");
  EXPECT_HAS(error_of([&] { value.as_object(); }), "is an array, expected an object");
}

}  // namespace
}  // namespace trainyard::testing
