// Byte-level BPE: special-token splitting, pre-tokenization, merges by rank, decoding, and the
// streaming decoder. Loading lives in tokenizer_load.cpp.
#include "model/tokenizer.h"

#include <algorithm>
#include <queue>
#include <stdexcept>

#include "model/tensor.h"
#include "model/tokenizer_impl.h"
#include "model/utf8.h"

namespace specula {

// ---- building the tables ----------------------------------------------------------------------

void Tokenizer::Impl::set_token(int32_t id, std::string text, Kind kind) {
  if (id < 0) throw ModelError("token id " + std::to_string(id) + " is negative");
  // Ids index a table: a corrupt id must not size it (vocabularies stay far below this).
  constexpr int32_t kMaxTokenId = (1 << 24) - 1;
  if (id > kMaxTokenId)
    throw ModelError("token id " + std::to_string(id) + " is larger than any vocabulary Specula loads (at most " +
                     std::to_string(kMaxTokenId) + ")");
  if (static_cast<size_t>(id) >= tokens.size()) {
    tokens.resize(id + 1);
    kinds.resize(id + 1, Kind::Unused);
  }
  tokens[id] = std::move(text);
  kinds[id] = kind;
}

void Tokenizer::Impl::add_added_token(AddedToken t) {
  set_token(t.id, t.text, t.special ? Kind::Special : Kind::Added);
  if (!t.text.empty()) added.push_back(std::move(t));
}

void Tokenizer::Impl::index() {
  by_string.clear();
  by_string.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (kinds[id] != Kind::Unused) by_string.emplace(tokens[id], static_cast<int32_t>(id));
  }
  // An added token shadows a vocabulary entry with the same text, as in HF's token_to_id.
  for (const AddedToken& t : added) by_string.insert_or_assign(t.text, t.id);
  for (int b = 0; b < 256; ++b) {
    auto it = by_string.find(byte_level::char_of_byte(static_cast<uint8_t>(b)));
    byte_ids[b] = it == by_string.end() ? -1 : it->second;
  }
}

void Tokenizer::Impl::add_merge(std::string_view left, std::string_view right, int32_t rank,
                                const std::string& source) {
  auto id_of = [&](std::string_view s) {
    auto it = by_string.find(s);
    if (it == by_string.end()) {
      throw ModelError(source + ": merge #" + std::to_string(rank) + " '" + std::string(left) + " " +
                       std::string(right) + "' uses '" + std::string(s) + "', which is not in the vocabulary");
    }
    return it->second;
  };
  const int32_t l = id_of(left), r = id_of(right);
  const int32_t m = id_of(std::string(left) + std::string(right));
  // The first occurrence of a pair keeps its rank (llama.cpp's convention for duplicates).
  merges.emplace(static_cast<uint64_t>(l) << 32 | static_cast<uint32_t>(r), Merge{rank, m});
}

void Tokenizer::Impl::finish(const std::string& source) {
  const auto n = static_cast<int32_t>(tokens.size());
  if (n == 0) throw ModelError(source + ": the vocabulary is empty");
  auto check = [&](int32_t id, const char* what) {
    if (id >= n) {
      throw ModelError(source + ": " + what + " id " + std::to_string(id) + " is outside the vocabulary of " +
                       std::to_string(n) + " tokens");
    }
  };
  check(bos_id, "bos");
  check(unk_id, "unk");
  for (int32_t e : eos_ids) check(e, "eos");

  bytes.assign(tokens.size(), {});
  by_bytes.clear();
  for (int32_t id = 0; id < n; ++id) {
    // A token outside the byte alphabet (an added token, or an odd vocabulary entry) stands
    // for its own UTF-8 text, which is also what HF's ByteLevel decoder does with it.
    if (kinds[id] != Kind::Normal || !byte_level::decode(tokens[id], bytes[id])) {
      bytes[id] = tokens[id];
      continue;
    }
    by_bytes.emplace(bytes[id], id);
  }

  for (auto& list : added_by_first_byte) list.clear();
  for (uint32_t i = 0; i < added.size(); ++i) {
    added_by_first_byte[static_cast<uint8_t>(added[i].text[0])].push_back(i);
  }
  for (auto& list : added_by_first_byte) {
    std::stable_sort(list.begin(), list.end(),
                     [&](uint32_t a, uint32_t b) { return added[a].text.size() > added[b].text.size(); });
  }
}

// ---- encoding ---------------------------------------------------------------------------------

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  // Special tokens first, leftmost then longest, as HF's added-vocabulary split; the text
  // between them is pre-tokenized on its own.
  size_t seg_start = 0, pos = 0;
  while (pos < text.size()) {
    const Impl::AddedToken* hit = nullptr;
    for (uint32_t i : m.added_by_first_byte[static_cast<uint8_t>(text[pos])]) {
      const Impl::AddedToken& t = m.added[i];
      if ((parse_special || !t.special) && text.compare(pos, t.text.size(), t.text) == 0) {
        hit = &t;
        break;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    size_t seg_end = pos;
    if (hit->lstrip) {
      while (seg_end > seg_start && is_space(text[seg_end - 1])) --seg_end;
    }
    m.encode_segment(text.substr(seg_start, seg_end - seg_start), out);
    out.push_back(hit->id);
    pos += hit->text.size();
    if (hit->rstrip) {
      while (pos < text.size() && is_space(text[pos])) ++pos;
    }
    seg_start = pos;
  }
  m.encode_segment(text.substr(seg_start), out);
  return out;
}

void Tokenizer::Impl::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string storage;
  std::vector<std::string_view> pieces;
  pre.split(text, storage, pieces);
  for (std::string_view piece : pieces) encode_piece(piece, out);
}

void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    if (auto it = by_bytes.find(piece); it != by_bytes.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() == 1) {
    bpe(piece, out);
    return;
  }
  {
    std::lock_guard lock(cache_mutex);
    if (auto it = cache.find(piece); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  bpe(piece, out);
  // Only the pieces words are made of: a long run (a megabyte of letters without a space) would
  // hold its megabyte and its tokens in an entry-counted cache.
  if (piece.size() > kCachedPieceBytes) return;
  std::lock_guard lock(cache_mutex);
  if (cache.size() >= kCacheLimit) cache.clear();
  cache.emplace(std::string(piece), std::vector<int32_t>(out.begin() + first, out.end()));
}

// Merges the adjacent pair of lowest rank until none is left, leftmost first among equal ranks
// (HF and llama.cpp agree on this order). Symbols form a linked list over the piece's bytes; a
// heap holds candidate pairs, and a popped pair is skipped when either side has changed since.
void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int prev, next;
  };
  std::vector<Symbol> sym;
  sym.reserve(piece.size());
  for (char c : piece) {
    int32_t id = byte_ids[static_cast<uint8_t>(c)];
    if (id < 0) id = unk_id;
    if (id < 0) continue;  // HF drops a character with no token when there is no unk token
    const int i = static_cast<int>(sym.size());
    sym.push_back(Symbol{id, i - 1, i + 1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  struct Candidate {
    int32_t rank;
    int left;
    int32_t left_id, right_id, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int left) {
    if (left < 0 || sym[left].next < 0) return;
    const int32_t l = sym[left].id, r = sym[sym[left].next].id;
    auto it = merges.find(static_cast<uint64_t>(l) << 32 | static_cast<uint32_t>(r));
    if (it != merges.end()) heap.push(Candidate{it->second.rank, left, l, r, it->second.merged});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) consider(i);

  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[c.left];
    if (left.id != c.left_id || left.next < 0 || sym[left.next].id != c.right_id) continue;  // stale
    const int right = left.next;
    left.id = c.merged;
    left.next = sym[right].next;
    if (left.next >= 0) sym[left.next].prev = c.left;
    sym[right].id = -1;  // dead: no pair can match it again
    consider(left.prev);
    consider(c.left);
  }
  for (int i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

// ---- decoding and lookups ---------------------------------------------------------------------

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

namespace {

void check_id(int32_t id, size_t n) {
  if (id < 0 || static_cast<size_t>(id) >= n) {
    throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(n) +
                            " tokens");
  }
}

}  // namespace

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string raw;
  for (int32_t id : ids) {
    check_id(id, impl_->tokens.size());
    if (skip_special && impl_->kinds[id] == Impl::Kind::Special) continue;
    raw += impl_->bytes[id];
  }
  return utf8::to_valid(raw);
}

std::string Tokenizer::token_bytes(int32_t id) const {
  check_id(id, impl_->tokens.size());
  return impl_->bytes[id];
}

const std::string& Tokenizer::token_string(int32_t id) const {
  check_id(id, impl_->tokens.size());
  return impl_->tokens[id];
}

int32_t Tokenizer::token_id(std::string_view token_string) const {
  auto it = impl_->by_string.find(token_string);
  return it == impl_->by_string.end() ? -1 : it->second;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->tokens.size()); }
int32_t Tokenizer::bos_id() const { return impl_->bos_id; }
const std::vector<int32_t>& Tokenizer::eos_ids() const { return impl_->eos_ids; }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->kinds.size() && impl_->kinds[id] == Impl::Kind::Special;
}

// ---- streaming ----------------------------------------------------------------------------------

StreamDecoder::StreamDecoder(std::shared_ptr<const Tokenizer> tok, bool skip_special)
    : tok_(std::move(tok)), skip_special_(skip_special) {
  if (!tok_) throw std::invalid_argument("StreamDecoder needs a tokenizer");
}

std::string StreamDecoder::push(int32_t id) {
  const Tokenizer::Impl& m = *tok_->impl_;
  check_id(id, m.tokens.size());
  if (skip_special_ && m.kinds[id] == Tokenizer::Impl::Kind::Special) return {};
  pending_ += m.bytes[id];
  std::string out;
  const size_t used = utf8::append_lossy(pending_, out, /*final_chunk=*/false);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  utf8::append_lossy(pending_, out, /*final_chunk=*/true);
  pending_.clear();
  return out;
}

}  // namespace specula
