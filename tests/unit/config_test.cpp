// Unit tests of trainyard/api/config.hpp: values, tables, option validation and getters.

#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <memory>
#include <string>

#include "test_support.hpp"
#include "trainyard/api/config.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {
namespace {

using testing::error_of;

Config section_from(const std::string& text, const std::string& section,
                    const std::string& file = "recipe.toml") {
  auto root = parse_toml(text, file);
  return Config(root->at(section).table_ptr(), section);
}

TEST(ConfigTest, SourceLocationFormats) {
  EXPECT_EQ((SourceLocation{"a.toml", 3, 7}).str(), "a.toml:3:7");
  EXPECT_EQ((SourceLocation{"a.toml", 0, 0}).str(), "a.toml");
  EXPECT_EQ(SourceLocation{}.str(), "<recipe>");
}

TEST(ConfigTest, ValueTypesAndAccessors) {
  EXPECT_EQ(Value(true).type(), ValueType::kBool);
  EXPECT_EQ(Value(3).type(), ValueType::kInteger);
  EXPECT_EQ(Value(std::int64_t{1} << 40).as_integer(), std::int64_t{1} << 40);
  EXPECT_EQ(Value(2.5).type(), ValueType::kFloat);
  EXPECT_EQ(Value("x").type(), ValueType::kString);
  EXPECT_EQ(Value(Array{Value(1), Value(2)}).type(), ValueType::kArray);
  EXPECT_EQ(Value(std::make_shared<const Table>()).type(), ValueType::kTable);
  // Integers are floats where floats are expected.
  EXPECT_DOUBLE_EQ(Value(4).as_float(), 4.0);
  EXPECT_EQ(Value("abc").as_string(), "abc");
  EXPECT_THROW(Value().type(), Error);
  SourceLocation where{"f.toml", 2, 5};
  EXPECT_EQ(Value(1, where).where().str(), "f.toml:2:5");
}

TEST(ConfigTest, ValueEqualityIsTypedAndDeep) {
  EXPECT_EQ(Value(1), Value(1));
  EXPECT_FALSE(Value(1) == Value(1.0));
  EXPECT_FALSE(Value(1) == Value(2));
  EXPECT_EQ(Value(Array{Value("a"), Value(2)}), Value(Array{Value("a"), Value(2)}));
  EXPECT_FALSE(Value(Array{Value("a")}) == Value(Array{Value("a"), Value("b")}));
  auto a = std::make_shared<Table>();
  a->set("x", Value(1));
  a->set("y", Value("s"));
  auto b = std::make_shared<Table>();
  b->set("y", Value("s"));
  b->set("x", Value(1));
  EXPECT_EQ(Value(std::shared_ptr<const Table>(a)), Value(std::shared_ptr<const Table>(b)));
  b->set("x", Value(2));
  EXPECT_FALSE(Value(std::shared_ptr<const Table>(a)) == Value(std::shared_ptr<const Table>(b)));
}

TEST(ConfigTest, TableKeepsWrittenOrderAndErases) {
  Table table;
  table.set("b", Value(1));
  table.set("a", Value(2));
  table.set("c", Value(3));
  table.set("a", Value(20));  // replacing keeps the position
  ASSERT_EQ(table.entries().size(), 3u);
  EXPECT_EQ(table.entries()[0].first, "b");
  EXPECT_EQ(table.entries()[1].first, "a");
  EXPECT_EQ(table.entries()[1].second.as_integer(), 20);
  EXPECT_TRUE(table.contains("a"));
  EXPECT_EQ(table.find("zz"), nullptr);
  EXPECT_TRUE(table.erase("a"));
  EXPECT_FALSE(table.erase("a"));
  EXPECT_FALSE(table.contains("a"));
  ASSERT_NE(table.find("c"), nullptr);
  EXPECT_EQ(table.find("c")->as_integer(), 3);
  EXPECT_EQ(table.at("c").as_integer(), 3);
  EXPECT_EQ(table.entries()[1].first, "c");
  table.where = SourceLocation{"t.toml", 4, 1};
  std::string missing = error_of([&] { table.at("missing"); });
  EXPECT_HAS(missing, "t.toml:4:1");
  EXPECT_HAS(missing, "missing");
}

TEST(ConfigTest, UnknownKeyIsLocated) {
  Config section = section_from("[model]\nplugin = \"m\"\nwidth = 3\n  widht = 4\n", "model");
  OptionSpecs specs = {option("width", 8, "width")};
  std::string message = error_of([&] { validate_section(section, specs); });
  // The line of the key (the column is that of its value, on the same line).
  EXPECT_HAS(message, "recipe.toml:4:");
  EXPECT_HAS(message, "unknown");
  EXPECT_HAS(message, "model.widht");
  EXPECT_HAS(message, "width");  // lists the known ones
}

TEST(ConfigTest, WrongTypesAreLocated) {
  OptionSpecs specs = {option("n", 1, "an integer"), option("lr", 0.1, "a float")};
  {
    Config section = section_from("[s]\nn = \"three\"\n", "s");
    std::string message = error_of([&] { validate_section(section, specs); });
    EXPECT_HAS(message, "recipe.toml:2:5");
    EXPECT_HAS(message, "s.n");
    EXPECT_HAS(message, "integer");
    EXPECT_HAS(message, "string");
  }
  {
    Config section = section_from("[s]\nn = 1.5\n", "s");
    std::string message = error_of([&] { validate_section(section, specs); });
    EXPECT_HAS(message, "recipe.toml:2:5");
    EXPECT_HAS(message, "integer");
    EXPECT_HAS(message, "float");
  }
  {
    Config section = section_from("[s]\nlr = true\n", "s");
    std::string message = error_of([&] { validate_section(section, specs); });
    EXPECT_HAS(message, "recipe.toml:2:6");
    EXPECT_HAS(message, "s.lr");
  }
}

TEST(ConfigTest, IntegerAcceptedForFloatAndStoredAsFloat) {
  Config section = section_from("[s]\nlr = 2\n", "s");
  Config resolved = validate_section(section, {option("lr", 0.1, "a float")});
  EXPECT_EQ(resolved.value("lr").type(), ValueType::kFloat);
  EXPECT_DOUBLE_EQ(resolved.get_float("lr"), 2.0);
  // The location survives the conversion.
  EXPECT_EQ(resolved.value("lr").where().str(), "recipe.toml:2:6");
}

TEST(ConfigTest, ListTypesAreChecked) {
  OptionSpecs specs = {option("sizes", std::vector<std::int64_t>{1, 2}, "ints"),
                       option("ratios", std::vector<double>{0.5}, "floats"),
                       option("names", std::vector<std::string>{"a"}, "strings")};
  Config good = section_from("[s]\nsizes = [3, 4]\nratios = [1, 2.5]\nnames = [\"x\"]\n", "s");
  Config resolved = validate_section(good, specs);
  EXPECT_EQ(resolved.get_int_list("sizes"), (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(resolved.get_float_list("ratios"), (std::vector<double>{1.0, 2.5}));
  EXPECT_EQ(resolved.get_string_list("names"), (std::vector<std::string>{"x"}));
  Config bad = section_from("[s]\nsizes = [3, \"four\"]\n", "s");
  std::string message = error_of([&] { validate_section(bad, specs); });
  EXPECT_HAS(message, "recipe.toml:2:9");
  EXPECT_HAS(message, "array of integers");
}

TEST(ConfigTest, MissingRequiredOption) {
  Config section = section_from("[data]\nplugin = \"d\"\n", "data");
  OptionSpecs specs = {required_option("path", OptionType::kString, "where the files are")};
  std::string message = error_of([&] { validate_section(section, specs); });
  EXPECT_HAS(message, "recipe.toml:1:1");
  EXPECT_HAS(message, "missing required option 'data.path'");
  EXPECT_HAS(message, "where the files are");
}

TEST(ConfigTest, DefaultsFilledAndWrittenValuesKept) {
  Config section = section_from("[s]\nb = 5\n", "s");
  OptionSpecs specs = {option("a", true, "a"), option("b", 1, "b"), option("c", "text", "c"),
                       option("d", 0.25, "d")};
  Config resolved = validate_section(section, specs);
  EXPECT_EQ(resolved.name(), "s");
  EXPECT_TRUE(resolved.get_bool("a"));
  EXPECT_EQ(resolved.get_int("b"), 5);
  EXPECT_EQ(resolved.get_string("c"), "text");
  EXPECT_DOUBLE_EQ(resolved.get_float("d"), 0.25);
  EXPECT_EQ(resolved.table().entries().size(), 4u);
  // The section given is not modified.
  EXPECT_FALSE(section.has("a"));
}

TEST(ConfigTest, ReservedPluginKeyPasses) {
  Config section = section_from("[s]\nplugin = \"p\"\n", "s");
  Config resolved = validate_section(section, {option("x", 1, "x")});
  EXPECT_EQ(resolved.get_string("plugin"), "p");
  // Without the reservation, plugin is an unknown key like any other.
  EXPECT_HAS(error_of([&] { validate_section(section, {option("x", 1, "x")}, {}); }),
             "unknown");
}

TEST(ConfigTest, GettersReportTypeErrorsWithLocation) {
  Config config = section_from("[opt]\nlr = \"fast\"\nn = 1.5\nflag = 1\n", "opt", "x.toml");
  std::string message = error_of([&] { config.get_float("lr"); });
  EXPECT_HAS(message, "x.toml:2:6");
  EXPECT_HAS(message, "opt.lr");
  EXPECT_HAS(message, "float");
  EXPECT_HAS(error_of([&] { config.get_int("n"); }), "x.toml:3:5");
  EXPECT_HAS(error_of([&] { config.get_bool("flag"); }), "x.toml:4:8");
  EXPECT_HAS(error_of([&] { config.get_string("n"); }), "string");
  EXPECT_HAS(error_of([&] { config.get_int_list("n"); }), "array of integers");
  EXPECT_HAS(error_of([&] { config.get_table("n"); }), "table");
  std::string missing = error_of([&] { config.get_int("nope"); });
  EXPECT_HAS(missing, "x.toml:1:1");
  EXPECT_HAS(missing, "opt.nope");
  EXPECT_DOUBLE_EQ(config.get_float("n"), 1.5);
}

TEST(ConfigTest, SubTablesAreQualified) {
  Config config = section_from("[sinks.jsonl]\nextra = { depth = \"deep\" }\n", "sinks");
  Config jsonl = config.get_table("jsonl");
  EXPECT_EQ(jsonl.name(), "sinks.jsonl");
  Config extra = jsonl.get_table("extra");
  EXPECT_EQ(extra.qualified("depth"), "sinks.jsonl.extra.depth");
  EXPECT_HAS(error_of([&] { extra.get_int("depth"); }), "sinks.jsonl.extra.depth");
}

TEST(ConfigTest, FailMessageFormat) {
  Config config = section_from("[optimizer]\nplugin = \"sgd\"\nlr = -1\n", "optimizer",
                               "recipes/x.toml");
  EXPECT_EQ(error_of([&] { config.fail("lr", "must be >= 0, got -1"); }),
            "recipes/x.toml:3:6: optimizer.lr must be >= 0, got -1");
  // A key that is absent is reported at its table.
  EXPECT_EQ(error_of([&] { config.fail("momentum", "is required here"); }),
            "recipes/x.toml:1:1: optimizer.momentum is required here");
}

TEST(ConfigTest, OpenBoundsAndTheirRules) {
  OptionSpecs specs = {
      option("eps", 1e-8, "epsilon").greater_than(0),
      option("beta", 0.9, "decay").at_least(0).less_than(1),
      option("every", 20, "interval").at_least(2).or_exactly(0, "for never"),
      option("mode", "auto", "how").one_of({"auto", "bar"}),
      option("name", "x", "free text"),
  };
  auto error = [&](const std::string& text) {
    return error_of(
        [&] { validate_section(section_from("[opt]\n" + text, "opt", "recipes/x.toml"), specs); });
  };
  EXPECT_EQ(error("eps = 0.0\n"), "recipes/x.toml:2:7: opt.eps must be > 0, got 0.0");
  EXPECT_EQ(error("beta = 1\n"), "recipes/x.toml:2:8: opt.beta must be >= 0 and < 1, got 1");
  EXPECT_EQ(error("every = 1\n"),
            "recipes/x.toml:2:9: opt.every must be >= 2, or 0 for never, got 1");
  EXPECT_NO_THROW(validate_section(
      section_from("[opt]\neps = 1e-12\nbeta = 0\nevery = 0\n", "opt"), specs));
  // The rules as `trainyard plugins` lists them.
  EXPECT_EQ(specs[0].rule(), "> 0");
  EXPECT_EQ(specs[1].rule(), ">= 0 and < 1");
  EXPECT_EQ(specs[2].rule(), ">= 2, or 0 for never");
  EXPECT_EQ(specs[3].rule(), "auto or bar");
  EXPECT_EQ(specs[4].rule(), "");
}

TEST(ConfigTest, TypeNamesTakeTheRightArticle) {
  EXPECT_EQ(with_article(to_string(OptionType::kInteger)), "an integer");
  EXPECT_EQ(with_article(to_string(OptionType::kIntegerList)), "an array of integers");
  EXPECT_EQ(with_article(to_string(OptionType::kFloat)), "a float");
  EXPECT_EQ(with_article(to_string(ValueType::kBool)), "a boolean");
  auto table = std::make_shared<Table>();
  table->set("n", Value("3", SourceLocation{"recipes/x.toml", 2, 5}));
  Config config(table, "run");
  EXPECT_EQ(error_of([&] { config.get_int("n"); }),
            "recipes/x.toml:2:5: run.n must be an integer, got a string");
}

TEST(ConfigTest, DeclaredRangesAreCheckedWhereTheValueEnters) {
  OptionSpecs specs = {
      option("epochs", 1, "passes").at_least(1),
      option("ratio", 0.5, "a share").at_least(0).at_most(1),
      option("workers", -1, "threads").at_least(0).or_exactly(-1, "for automatic"),
      option("mode", "auto", "how").one_of({"auto", "cores", "none"}),
      option("sizes", std::vector<std::int64_t>{1, 2}, "sizes").at_least(1),
  };
  auto error = [&](const std::string& text) {
    return error_of(
        [&] { validate_section(section_from("[run]\n" + text, "run", "recipes/x.toml"), specs); });
  };
  EXPECT_EQ(error("epochs = 0\n"), "recipes/x.toml:2:10: run.epochs must be >= 1, got 0");
  EXPECT_EQ(error("ratio = 1.5\n"), "recipes/x.toml:2:9: run.ratio must be >= 0 and <= 1, got 1.5");
  EXPECT_EQ(error("workers = -2\n"),
            "recipes/x.toml:2:11: run.workers must be >= 0, or -1 for automatic, got -2");
  EXPECT_EQ(error("mode = \"sometimes\"\n"),
            "recipes/x.toml:2:8: run.mode must be auto, cores or none, got \"sometimes\"");
  EXPECT_EQ(error("sizes = [2, 0]\n"), "recipes/x.toml:2:9: run.sizes must be >= 1, got 0");
  // In range, the sentinel, a listed choice and the defaults all pass.
  Config resolved = validate_section(
      section_from("[run]\nepochs = 1\nratio = 1\nworkers = -1\nmode = \"none\"\n", "run"), specs);
  EXPECT_EQ(resolved.get_int("workers"), -1);
  EXPECT_EQ(resolved.get_string("mode"), "none");
  EXPECT_NO_THROW(validate_section(section_from("[run]\n", "run"), specs));
}

TEST(ConfigTest, GetPathResolvesAgainstTheRecipeFolder) {
  testing::TempDir dir;
  std::string file = (dir.path() / "sub" / "recipe.toml").string();
  Config config = section_from(
      "[dataset]\nroot = \"data/fm\"\nabs = \"/srv/data\"\nempty = \"\"\n", "dataset", file);
  EXPECT_EQ(config.get_path("root"), dir.path() / "sub" / "data/fm");
  EXPECT_EQ(config.get_path("abs"), std::filesystem::path("/srv/data"));
  EXPECT_EQ(config.get_path("empty"), std::filesystem::path());
  // Values without a position (defaults, --set) stay relative to the working directory.
  auto table = std::make_shared<Table>();
  table->set("root", Value("data/fm", SourceLocation{"--set dataset.root=data/fm", 0, 0}));
  EXPECT_EQ(Config(table, "dataset").get_path("root"), std::filesystem::path("data/fm"));
}

TEST(ConfigTest, ValueToTomlRoundTrips) {
  auto inner = std::make_shared<Table>();
  inner->set("k", Value(1));
  inner->set("odd key", Value("v"));
  std::vector<Value> values = {
      Value(true),
      Value(false),
      Value(0),
      Value(-42),
      Value(std::numeric_limits<std::int64_t>::min()),
      Value(std::numeric_limits<std::int64_t>::max()),
      Value(0.1),
      Value(1.0),
      Value(-0.0),
      Value(3e-4),
      Value(1e300),
      Value(123456789.123456789),
      Value(""),
      Value("plain"),
      Value("quote \" backslash \\ newline \n tab \t bell \x07 del \x7f unicode \xc3\xa9"),
      Value(Array{}),
      Value(Array{Value(1), Value(2)}),
      Value(Array{Value("a"), Value(Array{Value(1.5)})}),
      Value(std::shared_ptr<const Table>(inner)),
      Value(std::make_shared<const Table>()),
  };
  for (const auto& value : values) {
    std::string text = "v = " + value.to_toml() + "\n";
    SCOPED_TRACE(text);
    std::shared_ptr<const Table> parsed;
    ASSERT_NO_THROW(parsed = parse_toml(text, "roundtrip"));
    ASSERT_TRUE(parsed->contains("v"));
    EXPECT_EQ(parsed->at("v"), value);
  }
  EXPECT_EQ(Value(1.0).to_toml(), "1.0");
  EXPECT_EQ(Value(0.1).to_toml(), "0.1");
  EXPECT_EQ(Value(7).to_toml(), "7");
  EXPECT_EQ(Value("a\"b").to_toml(), "\"a\\\"b\"");
}

TEST(ConfigTest, ValueMatches) {
  EXPECT_TRUE(value_matches(Value(1), OptionType::kFloat));
  EXPECT_FALSE(value_matches(Value(1.0), OptionType::kInteger));
  EXPECT_TRUE(value_matches(Value(Array{}), OptionType::kIntegerList));
  EXPECT_TRUE(value_matches(Value(Array{Value(1), Value(2.0)}), OptionType::kFloatList));
  EXPECT_FALSE(value_matches(Value(Array{Value(1), Value("x")}), OptionType::kFloatList));
  EXPECT_FALSE(value_matches(Value("x"), OptionType::kStringList));
  EXPECT_TRUE(value_matches(Value(std::make_shared<const Table>()), OptionType::kTable));
  EXPECT_FALSE(value_matches(Value(true), OptionType::kString));
}

}  // namespace
}  // namespace trainyard
