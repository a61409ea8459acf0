// `specula tokenize`: JSON-lines strings in, {"ids": [...], "decoded": "..."} lines out. The
// tokenizer parity oracle (tests/oracle/test_tokenizer_parity.py) compares this with Hugging
// Face tokenizers. A GGUF is read for its tokenizer only; no weights are loaded.
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tools/specula/args.h"
#include "tools/specula/commands.h"

namespace specula::cli {

namespace {

const char* kUsage =
    "usage: specula tokenize (--model FILE.gguf | --tokenizer tokenizer.json) --input IN.jsonl --output OUT.jsonl\n"
    "                        [--no-special]\n"
    "  --model FILE.gguf          use the tokenizer in a GGUF file's metadata\n"
    "  --tokenizer FILE           use a Hugging Face tokenizer.json\n"
    "  --input IN.jsonl           one JSON string per line (blank lines are skipped)\n"
    "  --output OUT.jsonl         one {\"ids\": [...], \"decoded\": \"...\"} per input string\n"
    "  --no-special               treat special-token text (e.g. <|im_start|>) as plain text\n"
    "A summary (strings, tokens, encode time) goes to stderr.\n";

std::shared_ptr<Tokenizer> load_tokenizer(const Args& a) {
  if (a.has("model") == a.has("tokenizer")) throw UsageError("give exactly one of --model and --tokenizer");
  if (a.has("model")) return Tokenizer::from_gguf(GgufFile(a.str("model")));
  return Tokenizer::from_hf_json(a.str("tokenizer"));
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  Args a(argc, argv, {"model", "tokenizer", "input", "output"}, {"no-special"});
  if (a.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!a.has("input") || !a.has("output")) throw UsageError("--input and --output are required");
  const std::shared_ptr<Tokenizer> tok = load_tokenizer(a);
  const bool parse_special = !a.flag("no-special");

  const std::string in_path = a.str("input"), out_path = a.str("output");
  std::ifstream in(in_path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open --input '" + in_path + "': " + std::strerror(errno));
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot create --output '" + out_path + "': " + std::strerror(errno));

  using clock = std::chrono::steady_clock;
  clock::duration encode_time{};
  size_t strings = 0, bytes = 0, tokens = 0, line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw std::runtime_error(in_path + " line " + std::to_string(line_no) + " is not valid JSON: " + e.what());
    }
    if (!value.is_string()) {
      throw std::runtime_error(in_path + " line " + std::to_string(line_no) + " is a JSON " + value.type_name() +
                               "; each line must be a JSON string");
    }
    const std::string& text = value.get_ref<const std::string&>();
    const auto t0 = clock::now();
    const std::vector<int32_t> ids = tok->encode(text, parse_special);
    encode_time += clock::now() - t0;
    const nlohmann::json row = {{"ids", ids}, {"decoded", tok->decode(ids)}};
    out << row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    ++strings;
    bytes += text.size();
    tokens += ids.size();
  }
  out.flush();
  if (!out) throw std::runtime_error("writing --output '" + out_path + "' failed");
  const double ms = std::chrono::duration<double, std::milli>(encode_time).count();
  std::fprintf(stderr, "tokenized %zu strings (%zu bytes) into %zu tokens; encode %.1f ms (%.2f MB/s)\n", strings, bytes,
               tokens, ms, ms > 0 ? bytes / ms / 1e3 : 0.0);
  return 0;
}

}  // namespace specula::cli
