// The tokenizer's private state, shared by tokenizer.cpp (encode/decode) and
// tokenizer_load.cpp (GGUF and tokenizer.json loaders). Not for use outside model/.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/pretokenizer.h"
#include "model/tokenizer.h"

namespace specula {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

struct Tokenizer::Impl {
  enum class Kind : uint8_t {
    Normal,   // produced by BPE
    Special,  // control token: recognised in text only when parse_special
    Added,    // user-defined / non-special added token: always recognised in text
    Unused,   // an id no token string was given for (a hole in a tokenizer.json vocab)
  };
  struct AddedToken {
    std::string text;
    int32_t id;
    bool special;
    bool lstrip, rstrip;  // swallow whitespace on that side (HF AddedToken flags)
  };
  struct Merge {
    int32_t rank;
    int32_t merged;
  };

  // Per id.
  std::vector<std::string> tokens;  // as stored, e.g. "Ġthe"
  std::vector<std::string> bytes;   // what it decodes to, e.g. " the"
  std::vector<Kind> kinds;

  StringMap<int32_t> by_string;    // token string -> id (first id wins)
  StringMap<int32_t> by_bytes;     // decoded bytes of a Normal token -> id (for ignore_merges)
  std::array<int32_t, 256> byte_ids{};  // single-byte tokens BPE starts from; -1 when absent
  std::unordered_map<uint64_t, Merge> merges;  // key: left id << 32 | right id

  std::vector<AddedToken> added;
  std::array<std::vector<uint32_t>, 256> added_by_first_byte;  // indexes into added, longest first

  PreTokenizer pre;
  bool ignore_merges = false;  // Llama 3: a piece that is itself a token is not merged
  int32_t unk_id = -1;
  int32_t bos_id = -1;
  std::vector<int32_t> eos_ids;

  // Pieces recur constantly (" the", " and"), so BPE results are memoised. Bounded: cleared
  // when full rather than evicted, which is enough to keep a long-running server's memory flat.
  static constexpr size_t kCacheLimit = 1 << 16;
  static constexpr size_t kCachedPieceBytes = 64;  // longer pieces are not kept (at most about 64 * 2^16 bytes in all)
  mutable std::mutex cache_mutex;
  mutable StringMap<std::vector<int32_t>> cache;

  // Loaders fill tokens and kinds (set_token, add_added_token), call index(), add the merges,
  // then finish(). `source` names the file in error messages.
  void set_token(int32_t id, std::string text, Kind kind);
  void add_added_token(AddedToken t);
  void index();
  // Throws ModelError naming the merge (by rank) and the part missing from the vocabulary.
  void add_merge(std::string_view left, std::string_view right, int32_t rank, const std::string& source);
  // Builds the decode and special-token tables and checks bos/eos/unk against the vocabulary.
  void finish(const std::string& source);

  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
};

}  // namespace specula
