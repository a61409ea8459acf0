// Byte-level BPE tokenizer (GPT-2 / SmolLM2 / Llama 3 families) and a streaming detokenizer.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace specula {

class GgufFile;

class Tokenizer {
 public:
  // From GGUF metadata (tokenizer.ggml.model == "gpt2"; .pre selects the pre-tokenizer regex).
  static std::shared_ptr<Tokenizer> from_gguf(const GgufFile& f);
  // From a Hugging Face tokenizer.json (model.type BPE with a ByteLevel pre-tokenizer).
  static std::shared_ptr<Tokenizer> from_hf_json(const std::string& path);
  // A stand-in vocabulary for benchmarks on random weights at real shapes: the 256 byte tokens,
  // then id i decodes to " t<i>"; no merges, no BOS, no end token.
  static std::shared_ptr<Tokenizer> numbered(int32_t vocab);
  virtual ~Tokenizer();

  // Text to ids. Special/added tokens written literally in the text become their ids when
  // parse_special is true. No BOS is added; callers (chat templates) decide.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // Ids to text; special tokens are rendered as their text unless skip_special.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The bytes one token stands for (byte-level decoded), e.g. " the" for "Ġthe".
  std::string token_bytes(int32_t id) const;
  // The token's string as stored in the vocabulary (e.g. "Ġthe").
  const std::string& token_string(int32_t id) const;
  int32_t token_id(std::string_view token_string) const;  // -1 when absent

  int32_t vocab_size() const;
  int32_t bos_id() const;
  const std::vector<int32_t>& eos_ids() const;
  bool is_special(int32_t id) const;

 protected:
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  friend class StreamDecoder;
};

// Incremental decoding for streaming: push ids one at a time, get text that never ends in
// half a UTF-8 character; flush() returns whatever is held back at the end.
class StreamDecoder {
 public:
  explicit StreamDecoder(std::shared_ptr<const Tokenizer> tok, bool skip_special = false);
  std::string push(int32_t id);
  std::string flush();

 private:
  std::shared_ptr<const Tokenizer> tok_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence
};

}  // namespace specula
