// Building a Tokenizer from GGUF metadata or a Hugging Face tokenizer.json. Every problem with
// the file is a ModelError that names the file, the field and the value.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/tensor.h"
#include "model/tokenizer.h"
#include "model/tokenizer_impl.h"

namespace specula {

using json = nlohmann::json;

// ---- numbered ----------------------------------------------------------------------------------

std::shared_ptr<Tokenizer> Tokenizer::numbered(int32_t vocab) {
  if (vocab < 256) throw std::invalid_argument("a numbered vocabulary needs at least the 256 byte tokens, got " +
                                               std::to_string(vocab));
  std::shared_ptr<Tokenizer> tok(new Tokenizer());
  Impl& m = *tok->impl_;
  m.pre = PreTokenizer::for_gguf_pre("gpt-2");
  for (int b = 0; b < 256; ++b) m.set_token(b, byte_level::char_of_byte(static_cast<uint8_t>(b)), Impl::Kind::Normal);
  for (int32_t id = 256; id < vocab; ++id) m.set_token(id, "\xc4\xa0t" + std::to_string(id), Impl::Kind::Normal);  // "Ġt<id>"
  m.index();
  m.finish("numbered vocabulary");
  return tok;
}

// ---- GGUF ---------------------------------------------------------------------------------------

std::shared_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  const std::string& src = f.path();
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2") {
    throw ModelError(src + ": tokenizer.ggml.model is '" + model +
                     "'; only byte-level BPE ('gpt2') is supported" + (model == "llama" ? " (this is SentencePiece)" : ""));
  }
  if (!f.has("tokenizer.ggml.pre")) {
    throw ModelError(src + ": tokenizer.ggml.pre is missing, so the pre-tokenizer is unknown "
                           "(supported: smollm, gpt-2, llama-bpe)");
  }
  const std::string pre = f.get_string("tokenizer.ggml.pre");

  std::shared_ptr<Tokenizer> tok(new Tokenizer());
  Impl& m = *tok->impl_;
  using Kind = Impl::Kind;
  try {
    m.pre = PreTokenizer::for_gguf_pre(pre);
  } catch (const std::runtime_error& e) {
    throw ModelError(src + ": " + e.what());
  }
  m.ignore_merges = pre == "llama-bpe" || pre == "llama3";  // as llama.cpp sets it for Llama 3

  const std::vector<std::string>& tokens = f.get_string_array("tokenizer.ggml.tokens");
  std::vector<int64_t> types;
  if (f.has("tokenizer.ggml.token_type")) {
    types = f.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != tokens.size()) {
      throw ModelError(src + ": tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                       " entries for " + std::to_string(tokens.size()) + " tokens");
    }
  }
  m.tokens.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t type = types.empty() ? 1 : types[i];
    const auto id = static_cast<int32_t>(i);
    if (type == 3 || type == 4) {  // 3 control, 4 user-defined (llama.cpp's token types)
      m.add_added_token({tokens[i], id, /*special=*/type == 3, false, false});
    } else {
      m.set_token(id, tokens[i], Kind::Normal);
    }
  }
  m.index();

  const std::vector<std::string>& merges = f.get_string_array("tokenizer.ggml.merges");
  for (size_t r = 0; r < merges.size(); ++r) {
    const size_t space = merges[r].find(' ', 1);
    if (space == std::string::npos) {
      throw ModelError(src + ": tokenizer.ggml.merges[" + std::to_string(r) + "] '" + merges[r] +
                       "' is not two tokens separated by a space");
    }
    std::string_view line = merges[r];
    m.add_merge(line.substr(0, space), line.substr(space + 1), static_cast<int32_t>(r), src);
  }

  auto id_or_none = [&](const char* key) { return static_cast<int32_t>(std::max<int64_t>(-1, f.get_int(key, -1))); };
  m.bos_id = id_or_none("tokenizer.ggml.bos_token_id");
  m.unk_id = id_or_none("tokenizer.ggml.unknown_token_id");
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    const int32_t id = id_or_none(key);
    if (id >= 0 && std::find(m.eos_ids.begin(), m.eos_ids.end(), id) == m.eos_ids.end()) m.eos_ids.push_back(id);
  }
  m.finish(src);
  return tok;
}

// ---- tokenizer.json -----------------------------------------------------------------------------

namespace {

// Field access that names what is wrong: "tokenizer.json: model.vocab is missing".
struct Json {
  const std::string& file;

  [[noreturn]] void fail(const std::string& what) const { throw ModelError(file + ": " + what); }

  const json& need(const json& obj, const char* key, const std::string& where) const {
    if (!obj.is_object()) fail(where + " is not an object");
    auto it = obj.find(key);
    if (it == obj.end()) fail(where + "." + key + " is missing");
    return *it;
  }
  std::string str(const json& obj, const char* key, const std::string& where) const {
    const json& v = need(obj, key, where);
    if (!v.is_string()) fail(where + "." + key + " is not a string: " + v.dump());
    return v.get<std::string>();
  }
  bool flag(const json& obj, const char* key, bool fallback, const std::string& where) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) fail(where + "." + key + " is not true/false: " + it->dump());
    return it->get<bool>();
  }
  int32_t id(const json& v, const std::string& where) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      fail(where + " is not a token id: " + v.dump());
    }
    return static_cast<int32_t>(v.get<int64_t>());
  }
};

// A String pattern matches literally; escaping every ASCII punctuation character is always
// valid in PCRE2, and other characters are literal anyway.
std::string quote_regex(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x80 && std::ispunct(static_cast<unsigned char>(c))) out += '\\';
    out += c;
  }
  return out;
}

// The Split / Digits / ByteLevel steps, possibly nested in Sequence. ByteLevel must come last:
// it rewrites the text into its byte alphabet, and later steps would see that alphabet.
void add_pre_tokenizer(const Json& J, const json& p, const std::string& where, PreTokenizer& pre, bool& byte_level) {
  const std::string type = J.str(p, "type", where);
  if (byte_level) J.fail(where + " (" + type + ") comes after ByteLevel, which is not supported");
  if (type == "Sequence") {
    const json& list = J.need(p, "pretokenizers", where);
    if (!list.is_array()) J.fail(where + ".pretokenizers is not a list");
    for (size_t i = 0; i < list.size(); ++i) {
      add_pre_tokenizer(J, list[i], where + ".pretokenizers[" + std::to_string(i) + "]", pre, byte_level);
    }
  } else if (type == "Split") {
    const json& pat = J.need(p, "pattern", where);
    std::string regex;
    if (pat.is_object() && pat.contains("Regex")) {
      regex = J.str(pat, "Regex", where + ".pattern");
    } else if (pat.is_object() && pat.contains("String")) {
      regex = quote_regex(J.str(pat, "String", where + ".pattern"));
    } else {
      J.fail(where + ".pattern is neither {\"Regex\": ...} nor {\"String\": ...}: " + pat.dump());
    }
    const std::string behavior = J.str(p, "behavior", where);
    if (behavior != "Isolated" && behavior != "Removed") {
      J.fail(where + ".behavior '" + behavior + "' is not supported (supported: Isolated, Removed)");
    }
    if (J.flag(p, "invert", false, where)) J.fail(where + ".invert = true is not supported");
    try {
      pre.add_split(regex, behavior == "Isolated" ? PreTokenizer::Behavior::Isolated : PreTokenizer::Behavior::Removed);
    } catch (const std::runtime_error& e) {
      J.fail(where + ": " + e.what());
    }
  } else if (type == "Digits") {
    pre.add_split(J.flag(p, "individual_digits", false, where) ? R"(\p{N})" : R"(\p{N}+)");
  } else if (type == "ByteLevel") {
    // HF prepends the space to every piece that exists when ByteLevel runs; only the case of
    // one whole segment is implemented, which is where real configs use it.
    if (J.flag(p, "add_prefix_space", true, where)) {
      if (!pre.empty()) J.fail(where + ": ByteLevel add_prefix_space after another split is not supported");
      pre.set_add_prefix_space(true);
    }
    if (J.flag(p, "use_regex", true, where)) pre.add_split(kGpt2Pattern);
    byte_level = true;
  } else {
    J.fail(where + ".type '" + type + "' is not supported (supported: Sequence, Split, Digits, ByteLevel)");
  }
}

// bos/eos are not in tokenizer.json; they live in the files beside it. generation_config.json
// wins over config.json, which wins over tokenizer_config.json (the order transformers uses).
struct SpecialIds {
  int32_t bos_id = -1;
  std::vector<int32_t> eos_ids;
};

SpecialIds read_special_ids(const std::filesystem::path& dir, const Tokenizer& tok) {
  SpecialIds m;
  auto load = [](const std::filesystem::path& p) -> json {
    std::ifstream in(p);
    if (!in) return json();
    try {
      return json::parse(in);
    } catch (const json::parse_error& e) {
      throw ModelError(p.string() + ": not valid JSON: " + e.what());
    }
  };
  auto as_ids = [](const json& v) {
    std::vector<int32_t> ids;
    if (v.is_number_integer()) ids.push_back(v.get<int32_t>());
    if (v.is_array()) {
      for (const json& e : v) {
        if (e.is_number_integer()) ids.push_back(e.get<int32_t>());
      }
    }
    return ids;
  };
  bool have_bos = false, have_eos = false;
  for (const char* name : {"generation_config.json", "config.json"}) {
    const json j = load(dir / name);
    if (!j.is_object()) continue;
    if (!have_bos && j.contains("bos_token_id") && !as_ids(j["bos_token_id"]).empty()) {
      m.bos_id = as_ids(j["bos_token_id"]).front();
      have_bos = true;
    }
    if (!have_eos && j.contains("eos_token_id") && !as_ids(j["eos_token_id"]).empty()) {
      m.eos_ids = as_ids(j["eos_token_id"]);
      have_eos = true;
    }
  }
  const json tc = load(dir / "tokenizer_config.json");
  if (!tc.is_object()) return m;
  auto token_of = [&](const char* key) -> int32_t {
    if (!tc.contains(key)) return -1;
    const json& v = tc[key];
    const json& s = v.is_object() && v.contains("content") ? v["content"] : v;
    return s.is_string() ? tok.token_id(s.get<std::string>()) : -1;
  };
  if (!have_bos) m.bos_id = token_of("bos_token");
  if (!have_eos && token_of("eos_token") >= 0) m.eos_ids = {token_of("eos_token")};
  return m;
}

}  // namespace

std::shared_ptr<Tokenizer> Tokenizer::from_hf_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ModelError(path + ": cannot open tokenizer file (" + std::strerror(errno) + ")");
  json root;
  try {
    root = json::parse(in);
  } catch (const json::parse_error& e) {
    throw ModelError(path + ": not valid JSON: " + e.what());
  }
  const Json J{path};
  if (!root.is_object()) J.fail("the top level is not an object");

  const json& model = J.need(root, "model", "tokenizer");
  const std::string type = model.contains("type") ? J.str(model, "type", "model") : "BPE";
  if (type != "BPE") J.fail("model.type is '" + type + "'; only BPE is supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && model[key] != "") {
      J.fail(std::string("model.") + key + " is set, which byte-level BPE does not use");
    }
  }
  if (root.contains("normalizer") && !root["normalizer"].is_null()) {
    const json& n = root["normalizer"];
    const std::string ntype = n.is_object() && n.contains("type") && n["type"].is_string() ? n["type"].get<std::string>() : n.dump();
    const bool empty_sequence = ntype == "Sequence" && n.contains("normalizers") && n["normalizers"].empty();
    if (!empty_sequence) J.fail("normalizer '" + ntype + "' is not supported (only none)");
  }

  std::shared_ptr<Tokenizer> tok(new Tokenizer());
  Impl& m = *tok->impl_;
  using Kind = Impl::Kind;
  bool byte_level = false;
  if (root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null()) {
    add_pre_tokenizer(J, root["pre_tokenizer"], "pre_tokenizer", m.pre, byte_level);
  }
  if (!byte_level) J.fail("pre_tokenizer has no ByteLevel step; only byte-level BPE is supported");
  m.ignore_merges = J.flag(model, "ignore_merges", false, "model");

  const json& vocab = J.need(model, "vocab", "model");
  if (!vocab.is_object()) J.fail("model.vocab is not an object of token -> id");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = J.id(it.value(), "model.vocab[\"" + it.key() + "\"]");
    if (static_cast<size_t>(id) < m.kinds.size() && m.kinds[id] != Kind::Unused) {
      J.fail("model.vocab gives id " + std::to_string(id) + " to both '" + m.tokens[id] + "' and '" + it.key() + "'");
    }
    m.set_token(id, it.key(), Kind::Normal);
  }
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    const json& list = root["added_tokens"];
    if (!list.is_array()) J.fail("added_tokens is not a list");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      const std::string content = J.str(list[i], "content", where);
      if (content.empty()) J.fail(where + ".content is empty");
      // single_word and normalized are not modelled: without a normalizer `normalized` changes
      // nothing, and single_word appears in no byte-level BPE config we target.
      m.add_added_token({content, J.id(J.need(list[i], "id", where), where + ".id"),
                         J.flag(list[i], "special", false, where), J.flag(list[i], "lstrip", false, where),
                         J.flag(list[i], "rstrip", false, where)});
    }
  }
  m.index();

  const json& merges = J.need(model, "merges", "model");
  if (!merges.is_array()) J.fail("model.merges is not a list");
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& e = merges[r];
    const auto rank = static_cast<int32_t>(r);
    if (e.is_string()) {  // "left right"
      const std::string& s = e.get_ref<const std::string&>();
      const size_t space = s.find(' ', 1);
      if (space == std::string::npos) J.fail("model.merges[" + std::to_string(r) + "] '" + s + "' has no space");
      m.add_merge(std::string_view(s).substr(0, space), std::string_view(s).substr(space + 1), rank, path);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // ["left", "right"]
      m.add_merge(e[0].get_ref<const std::string&>(), e[1].get_ref<const std::string&>(), rank, path);
    } else {
      J.fail("model.merges[" + std::to_string(r) + "] is neither \"a b\" nor [\"a\", \"b\"]: " + e.dump());
    }
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    m.unk_id = tok->token_id(model["unk_token"].get<std::string>());
  }
  SpecialIds special = read_special_ids(std::filesystem::path(path).parent_path(), *tok);
  m.bos_id = special.bos_id;
  m.eos_ids = std::move(special.eos_ids);
  m.finish(path);
  return tok;
}

}  // namespace specula
