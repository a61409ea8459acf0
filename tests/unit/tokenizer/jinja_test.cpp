// The Jinja interpreter's limits and the values it is handed: what the oracle against Jinja2
// (tests/oracle/test_chat_templates.py) cannot show, because Jinja2 itself recurses or runs on.
#include "model/jinja.h"

#include <gtest/gtest.h>

#include <string>

#include "tokenizer_test_support.h"

namespace specula::jinja {
namespace {

std::string render(const std::string& source, const nlohmann::ordered_json& vars = nlohmann::ordered_json::object()) {
  return Template(source).render(Value::from_json(vars));
}

TEST(Jinja, AnExpressionNestedPastTheLimitIsRefusedNotACrash) {
  const std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  test::expect_error<Error>([&] { Template t(deep); }, {"nested too deeply"});
  EXPECT_EQ(render("{{ " + std::string(30, '(') + "1" + std::string(30, ')') + " }}"), "1");
}

TEST(Jinja, AChainOfOperatorsTooTallToEvaluateIsRefusedNotACrash) {
  std::string chain = "{{ 1";
  for (int i = 0; i < 20000; ++i) chain += " + 1";
  test::expect_error<Error>([&] { Template t(chain + " }}"); }, {"nested too deeply"});
  // Lists 150 deep (within the nesting limit), each the head of a chain of ten additions.
  std::string lists = "0";
  for (int i = 0; i < 150; ++i) {
    lists = "[" + lists;
    for (int k = 0; k < 10; ++k) lists += " + [0]";
    lists += "]";
  }
  test::expect_error<Error>([&] { Template t("{{ " + lists + " }}"); }, {"nested too deeply"});
  EXPECT_EQ(render("{{ (1 + 1 + 1) | string ~ 'x' | upper }}"), "3X");
}

TEST(Jinja, BlocksNestedPastTheLimitAreRefusedNotACrash) {
  std::string deep;
  for (int i = 0; i < 5000; ++i) deep += "{% if true %}";
  test::expect_error<Error>([&] { Template t(deep); }, {"nested too deeply"});
}

TEST(Jinja, AMacroThatCallsItselfForeverIsStoppedWithAnError) {
  test::expect_error<Error>([] { render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"); }, {"too deeply"});
}

TEST(Jinja, ARangeTooLongToHoldIsAnError) {
  test::expect_error<Error>([] { render("{{ range(100000000) | length }}"); }, {"1,000,000"});
}

TEST(Jinja, ArithmeticThatWouldOverflowOrTrapIsAnErrorNotUndefinedBehaviour) {
  test::expect_error<Error>([] { render("{{ 9223372036854775807 + 1 }}"); }, {"integer overflow"});
  test::expect_error<Error>([] { render("{{ 3 ** 64 }}"); }, {"integer overflow"});
  test::expect_error<Error>([] { render("{{ (-9223372036854775807 - 1) // -1 }}"); }, {"integer overflow"});
  test::expect_error<Error>([] { render("{{ 1 // 0 }}"); }, {"division by zero"});
  test::expect_error<Error>([] { render("{{ 'ab' * 100000000000 }}"); }, {"repeated past"});
  test::expect_error<Error>([] { Template t("{{ '\\xZZ' }}"); }, {"bad \\x escape"});
  test::expect_error<Error>([] { Template t("{{ x.99999999999999999999999 }}"); }, {"out of range"});
}

TEST(Jinja, TemplatesThatTrapOrGrowWithoutBoundAreErrorsNotCrashes) {
  EXPECT_EQ(render("{{ [1, 2, 3][1::9223372036854775807] }}"), "[2]");
  EXPECT_EQ(render("{{ (-9223372036854775807 - 1) is divisibleby(-1) }}"), "True");
  test::expect_error<Error>([] { render("{{ -(-9223372036854775807 - 1) }}"); }, {"integer overflow"});
  test::expect_error<Error>([] { render("{{ 'a' | round }}"); }, {"round needs a number"});
  test::expect_error<Error>([] { render("{{ [1] | tojson(indent=100000000000) }}"); }, {"indent above 4096"});
  EXPECT_EQ(render("{{ [[1]] | map(attribute='99999999999999999999') | list }}"), "[]");
  test::expect_error<Error>(
      [] { render("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}"); },
      {"nested deeper than 256"});
  test::expect_error<Error>(
      [] { render("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"); },
      {"longer than 64 MiB"});
  test::expect_error<Error>([] { render("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}"); },
                            {"10,000,000 loop iterations"});
  test::expect_error<Error>([] { render("{{ ('x' * 60000000) | replace('x', 'yy') }}"); }, {"longer than 64 MiB"});
}

TEST(Jinja, ValuesFromJsonKeepTheirTypesAndKeyOrder) {
  const auto vars = nlohmann::ordered_json::parse(R"({"d": {"z": 1, "a": [true, null, 2.5, "s"]}})");
  EXPECT_EQ(render("{{ d }}|{{ d | tojson }}", vars), "{'z': 1, 'a': [True, None, 2.5, 's']}|{\"z\": 1, \"a\": [true, null, 2.5, \"s\"]}");
}

TEST(Jinja, BreakOutsideALoopIsAnErrorWhenReached) {
  EXPECT_EQ(render("{% if false %}{% break %}{% endif %}ok"), "ok");
  test::expect_error<Error>([] { render("{% break %}"); }, {"outside a loop"});
}

TEST(Jinja, RaiseExceptionIsItsOwnErrorTypeCarryingTheMessage) {
  try {
    render("{{ raise_exception('no ' ~ 1) }}");
    ADD_FAILURE() << "expected Raised";
  } catch (const Raised& e) {
    EXPECT_STREQ(e.what(), "no 1");
  }
}

}  // namespace
}  // namespace specula::jinja
