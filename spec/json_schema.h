// JSON Schema to a grammar (spec/grammar.h): OpenAI's response_format {"type": "json_schema"},
// vLLM's guided_json and llama.cpp's json_schema. The output is one JSON value that the schema
// accepts, with its object members in the order the schema lists them (as llama.cpp and vLLM's
// grammar back ends write them).
//
// Kept: type (one or a list), properties, required, additionalProperties, items, prefixItems,
// minItems, maxItems, minLength, maxLength, pattern, enum, const, anyOf, oneOf (as anyOf), allOf
// of one schema, $ref into the document (#, #/$defs/..., #/definitions/...; recursion allowed),
// nullable, minimum / maximum / exclusiveMinimum / exclusiveMaximum / multipleOf (exactly, as the decimals the
// schema wrote; a bounded number has no exponent), and the formats date, time, date-time,
// duration, uuid, ipv4, ipv6, hostname, email and uri (docs/speculative.md says how closely).
// Annotations are read past (title, description, default, examples, other formats, $schema, ...).
// Any other assertion (uniqueItems, ...) is refused, naming it and where it is,
// rather than ignored: an output the schema refuses would break the promise.
//
// An object writes only the properties the schema lists (a required one always, an optional one
// where the model chooses), never others, which every additionalProperties setting accepts; an
// object without listed properties is a map of additionalProperties' values (any value where that
// is absent or true). Whitespace between tokens is at most 20 bytes in a row; integers have at most
// 16 digits, fractions 16 and exponents 3, so a model cannot run on forever inside a number.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace specula {

// The GBNF of the values `schema` accepts. Throws std::invalid_argument naming the part of the
// schema it cannot keep ("json_schema: /properties/age: multipleOf is not supported").
std::string gbnf_of_json_schema(const nlohmann::ordered_json& schema);

// GBNF for one of a list of strings, written as they are (vLLM's guided_choice).
std::string gbnf_of_choices(const std::vector<std::string>& choices);

// GBNF for the texts a regular expression matches whole (vLLM's guided_regex). The subset that
// regular-expression engines agree on: literals and escapes (\n \t \r \f \v \xHH \uHHHH, \.
// and the like), `.` (any character but a newline), classes with ranges and negation, \d \w \s
// and their negations, groups ((...), (?:...), (?P<name>...), (?<name>...)), `|`, and the
// quantifiers * + ? {m} {m,} {m,n} (lazy ones as greedy: the same texts). `^` at the start and `$`
// at the end are read past. Back-references, lookaround, word boundaries, flags and possessive
// quantifiers are refused ("regex: ... is not supported at byte N"). With `json_string`, the
// characters a JSON string would have to escape (", \ and controls) are left out of every class
// and literal: the texts are those a JSON string holds as they are.
std::string gbnf_expression_of_regex(std::string_view pattern, bool json_string = false);
std::string gbnf_of_regex(std::string_view pattern);

// A GBNF string literal of `bytes` (quoted, with \" \\ and control bytes escaped).
std::string gbnf_literal(const std::string& bytes);

}  // namespace specula
