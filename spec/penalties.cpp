// Penalties and logit bias over a request's own tokens (spec/penalties.h).
#include "spec/penalties.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <limits>
#include <stdexcept>
#include <string_view>

#include "model/tokenizer.h"
#include "spec/utf8.h"

namespace specula {

namespace {
constexpr uint8_t kInPrompt = 1, kBiased = 2, kTouched = 4, kStop = 8;
constexpr uint8_t kKept = kInPrompt | kBiased | kStop;  // touched whatever the output holds
std::atomic<bool> g_ignore_draft{false};

// The memory of JSON mode's row copies, handed from one Undo to the thread's next: a fresh
// allocation of a round's rows (a megabyte) would come as new zeroed pages every round.
std::vector<float>& spare_rows() {
  thread_local std::vector<float> v;
  return v;
}
}  // namespace

void PenaltyHistory::Undo::clear() {
  saved.clear();
  rows.clear();
  rows_at.clear();
  if (rows.capacity() > spare_rows().capacity()) spare_rows().swap(rows);
}

namespace {
// The bytes of the whitespace `text` starts with, as Python's str.lstrip() sees whitespace: ASCII's
// and \x1c-\x1f, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
size_t leading_whitespace(std::string_view text) {
  size_t at = 0;
  while (at < text.size()) {
    size_t next = at;
    const std::optional<uint32_t> cp = utf8::decode(text, next);
    const bool space = cp && (*cp == ' ' || (*cp >= 0x09 && *cp <= 0x0D) || (*cp >= 0x1C && *cp <= 0x1F) || *cp == 0x85 ||
                              *cp == 0xA0 || *cp == 0x1680 || (*cp >= 0x2000 && *cp <= 0x200A) || *cp == 0x2028 ||
                              *cp == 0x2029 || *cp == 0x202F || *cp == 0x205F || *cp == 0x3000);
    if (!space) break;
    at = next;
  }
  return at;
}
}  // namespace

void set_token_lists(SamplingParams& sp, std::vector<int32_t> allowed, std::span<const std::string> words,
                     const Tokenizer* tokenizer, int64_t vocab) {
  sp.allowed_token_ids = std::move(allowed);
  if (words.size() > kMaxBadWords)
    throw std::invalid_argument("bad_words has " + std::to_string(words.size()) + " words; the limit is " + std::to_string(kMaxBadWords));
  if (!words.empty() && !tokenizer) throw std::invalid_argument("bad_words needs the model's tokenizer");
  sp.bad_words = words.empty() ? std::vector<std::vector<int32_t>>{} : bad_words_token_ids(*tokenizer, words);
  if (!sp.allowed_token_ids.empty() || !sp.bad_words.empty()) sp.validate_lists(vocab);
}

std::vector<std::vector<int32_t>> bad_words_token_ids(const Tokenizer& tokenizer, std::span<const std::string> words) {
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    const size_t start = leading_whitespace(word);
    if (start == word.size())
      throw std::invalid_argument("bad_words[" + std::to_string(i) + "] is empty or only whitespace");
    const std::string_view bare = std::string_view(word).substr(start);
    out.push_back(tokenizer.encode(bare));
    if (out.back().empty()) throw std::invalid_argument("bad_words[" + std::to_string(i) + "] has no tokens");
    std::vector<int32_t> spaced = tokenizer.encode(" " + std::string(bare));
    if (!spaced.empty() && spaced.size() == out.back().size() && spaced.front() != out.back().front())
      out.push_back(std::move(spaced));
  }
  return out;
}

namespace test_seams {
void set_penalties_ignore_draft(bool on) { g_ignore_draft.store(on, std::memory_order_relaxed); }
}  // namespace test_seams

PenaltyHistory::PenaltyHistory(const SamplingParams& sp, std::span<const int32_t> prompt, int64_t vocab,
                               std::span<const int32_t> stop_ids)
    : presence_(sp.presence_penalty),
      frequency_(sp.frequency_penalty),
      repetition_(sp.repetition_penalty),
      active_(sp.penalized()),
      vocab_(vocab) {
  if (!active_) return;
  json_ = sp.json_object;
  if (json_) json_states_.assign(1, JsonState{});
  grammar_ = sp.grammar;
  if (grammar_) grammar_states_.assign(1, grammar_->start());
  bias_list_ = sp.logit_bias;
  prompt_.assign(prompt.begin(), prompt.end());
  stop_ids_.assign(stop_ids.begin(), stop_ids.end());
  min_tokens_ = sp.min_tokens;
  const auto V = static_cast<size_t>(vocab);
  count_.assign(V, 0);
  flags_.assign(V, 0);
  if (!sp.logit_bias.empty()) bias_.assign(V, 0.0f);
  for (const auto& [token, bias] : sp.logit_bias) {
    if (token < 0 || token >= vocab) continue;  // validate(vocab) refuses these before a request runs
    bias_[static_cast<size_t>(token)] += bias;  // a token named twice (JSON cannot) adds up
    flags_[static_cast<size_t>(token)] |= kBiased;
    touch(token);
  }
  if (min_tokens_ > 0)
    for (int32_t t : stop_ids) {
      if (t < 0 || t >= vocab) continue;
      flags_[static_cast<size_t>(t)] |= kStop;
      touch(t);
    }
  if (repetition_ != 1.0f)
    for (int32_t t : prompt) {
      if (t < 0 || t >= vocab) continue;
      flags_[static_cast<size_t>(t)] |= kInPrompt;
      touch(t);
    }
  allowed_given_ = sp.allowed_token_ids;
  for (int32_t t : sp.allowed_token_ids)
    if (t >= 0 && t < vocab) allowed_.push_back(t);  // validate(vocab) refuses the others before a request runs
  std::sort(allowed_.begin(), allowed_.end());
  allowed_.erase(std::unique(allowed_.begin(), allowed_.end()), allowed_.end());
  for (int32_t t : allowed_) flags_[static_cast<size_t>(t)] |= kAllowedFlag;
  bad_words_ = sp.bad_words;
  lists_ = !sp.allowed_token_ids.empty() || !bad_words_.empty();
  refresh_banned();
}

void PenaltyHistory::banned_after(std::span<const int32_t> extra, std::vector<int32_t>& out) const {
  out.clear();
  const size_t n_out = output_.size(), len = n_out + extra.size();
  const auto token_at = [&](size_t i) { return i < n_out ? output_[i] : extra[i - n_out]; };
  for (const auto& w : bad_words_) {
    if (w.empty()) continue;  // validate() refuses these
    const size_t before = w.size() - 1;  // the tokens the output must end with
    if (before > len) continue;
    size_t j = 0;
    while (j < before && token_at(len - before + j) == w[j]) ++j;
    if (j == before && w.back() >= 0 && w.back() < vocab_) out.push_back(w.back());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

void PenaltyHistory::refresh_banned() {
  if (bad_words_.empty()) return;
  for (int32_t t : banned_) flags_[static_cast<size_t>(t)] &= static_cast<uint8_t>(~kBannedFlag);
  banned_after({}, banned_);
  for (int32_t t : banned_) flags_[static_cast<size_t>(t)] |= kBannedFlag;
}

void PenaltyHistory::mask_lists(std::span<float> row, std::span<const int32_t> extra, Undo* undo, size_t at) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  thread_local std::vector<int32_t> banned;
  banned_after(extra, banned);
  if (allowed_.empty() && banned.empty()) return;  // nothing to mask in this row
  const auto is_banned = [&](size_t v) { return std::binary_search(banned.begin(), banned.end(), static_cast<int32_t>(v)); };
  // A row the lists would leave with no token is left as it was (the token drawn from it is one
  // they refuse: the request ends there with an error, as target-only sampling would).
  bool any_left = false;
  if (!allowed_.empty()) {
    for (int32_t t : allowed_)
      if (row[static_cast<size_t>(t)] != kNegInf && !is_banned(static_cast<size_t>(t))) {
        any_left = true;
        break;
      }
  } else {
    for (size_t v = 0; v < row.size() && !any_left; ++v) any_left = row[v] != kNegInf && !is_banned(v);
  }
  if (!any_left) return;
  // Most of the row changes, or a grammar's copy of it is put back before the entries saved: the
  // whole of it kept (PenaltyHistory::restore puts the copies back last to first, then the entries).
  const bool whole = !allowed_.empty() || json_ || grammar_;
  if (undo && whole) {
    if (undo->rows.capacity() == 0) undo->rows.swap(spare_rows());
    undo->rows_at.push_back(at);
    undo->rows.insert(undo->rows.end(), row.begin(), row.end());
  }
  if (!allowed_.empty()) {
    thread_local std::vector<float> kept;
    kept.resize(allowed_.size());
    for (size_t j = 0; j < allowed_.size(); ++j) kept[j] = row[static_cast<size_t>(allowed_[j])];
    std::fill(row.begin(), row.end(), kNegInf);
    for (size_t j = 0; j < allowed_.size(); ++j) row[static_cast<size_t>(allowed_[j])] = kept[j];
  }
  for (int32_t t : banned) {
    const auto v = static_cast<size_t>(t);
    if (undo && !whole) undo->saved.emplace_back(at + v, row[v]);
    row[v] = kNegInf;
  }
}

void PenaltyHistory::touch(int32_t v) {
  uint8_t& f = flags_[static_cast<size_t>(v)];
  if (f & kTouched) return;
  f |= kTouched;
  touched_.push_back(v);
}

void PenaltyHistory::push(int32_t token) {
  if (!active_) return;
  ++length_;
  if (!bad_words_.empty()) {
    output_.push_back(token);
    refresh_banned();
  }
  if (json_ || grammar_) {
    JsonState js = json_ ? json_states_.back() : JsonState{};
    GrammarMatcher::State gs = grammar_ ? grammar_states_.back() : GrammarMatcher::kDead;
    advance(js, gs, token);
    if (json_) json_states_.push_back(js);
    if (grammar_) grammar_states_.push_back(gs);
  }
  if (token < 0 || token >= vocab_) return;
  ++count_[static_cast<size_t>(token)];
  touch(token);
}

void PenaltyHistory::pop(int32_t token) {
  if (!active_ || length_ == 0) return;
  --length_;
  if (!bad_words_.empty()) {
    output_.pop_back();
    refresh_banned();
  }
  if (json_) json_states_.pop_back();
  if (grammar_) grammar_states_.pop_back();
  if (token < 0 || token >= vocab_) return;
  const auto at = static_cast<size_t>(token);
  if (count_[at] == 0) return;
  if (--count_[at] > 0 || (flags_[at] & kKept)) return;
  flags_[at] &= static_cast<uint8_t>(~kTouched);
  touched_.erase(std::find(touched_.begin(), touched_.end(), token));
}

bool PenaltyHistory::made_for(const SamplingParams& sp, std::span<const int32_t> prompt,
                              std::span<const int32_t> stop_ids) const {
  if (sp.penalized() != active_) return false;
  if (!active_) return true;
  return sp.presence_penalty == presence_ && sp.frequency_penalty == frequency_ && sp.repetition_penalty == repetition_ &&
         sp.logit_bias == bias_list_ && sp.min_tokens == min_tokens_ && sp.json_object == json_ && sp.grammar == grammar_ &&
         sp.allowed_token_ids == allowed_given_ && sp.bad_words == bad_words_ &&
         std::equal(prompt.begin(), prompt.end(), prompt_.begin(), prompt_.end()) &&
         std::equal(stop_ids.begin(), stop_ids.end(), stop_ids_.begin(), stop_ids_.end());
}

void PenaltyHistory::advance(JsonState& js, GrammarMatcher::State& gs, int32_t token) const {
  // A stop token ends the output as it stands, where the constraint may end there.
  const bool stop = std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end();
  if (json_ && !(stop && js.done())) js = json_->after(js, token);
  if (grammar_ && !(stop && grammar_->accepting(gs))) gs = grammar_->after(gs, token);
}

float PenaltyHistory::adjusted(float x, int32_t v, int32_t count, int64_t length) const {
  const uint8_t f = flags_[static_cast<size_t>(v)];
  if ((f & kStop) && length < min_tokens_) return -std::numeric_limits<float>::infinity();
  if (f & kBiased) x += bias_[static_cast<size_t>(v)];
  if (repetition_ != 1.0f && ((f & kInPrompt) || count > 0)) x = x > 0.0f ? x / repetition_ : x * repetition_;
  if (count > 0) {
    x -= frequency_ * static_cast<float>(count);
    x -= presence_;
  }
  return x;
}

void PenaltyHistory::apply(std::span<float> rows, std::span<const int32_t> draft, Undo& undo) { adjust(rows, draft, &undo); }
void PenaltyHistory::apply(std::span<float> rows, std::span<const int32_t> draft) { adjust(rows, draft, nullptr); }

void PenaltyHistory::adjust(std::span<float> rows, std::span<const int32_t> draft, Undo* undo) {
  if (!active_) return;
  const auto V = static_cast<size_t>(vocab_);
  assert(rows.size() % V == 0);
  const size_t n = rows.size() / V;
  assert(draft.size() + 1 >= n);
  const bool ignore_draft = g_ignore_draft.load(std::memory_order_relaxed);
  // Row i's output is the history plus draft[0..i-1]: count those in, row by row, then take them
  // out again (and forget the tokens they touched first).
  const size_t touched_before = touched_.size();
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && !ignore_draft) {
      const int32_t t = draft[i - 1];
      if (t >= 0 && t < vocab_) {
        ++count_[static_cast<size_t>(t)];
        touch(t);
      }
    }
    float* row = rows.data() + i * V;
    for (int32_t v : touched_) {
      const size_t at = static_cast<size_t>(v);
      const float x = row[at];
      const float y = adjusted(x, v, count_[at], length_ + (ignore_draft ? 0 : static_cast<int64_t>(i)));
      if (undo) undo->saved.emplace_back(i * V + at, x);
      row[at] = y;
    }
  }
  if (json_ || grammar_) {
    // Row i: the state after the output and draft[0..i-1]. A row after a draft token the
    // constraint refuses is never judged (that token has p = 0 at the row before); it is masked
    // as closed (JSON mode) or dead (a grammar).
    JsonState js = json_ ? json_states_.back() : JsonState{};
    GrammarMatcher::State gs = grammar_ ? grammar_states_.back() : GrammarMatcher::kDead;
    for (size_t i = 0; i < n; ++i) {
      if (i > 0 && !ignore_draft) advance(js, gs, draft[i - 1]);
      const std::span<float> row = rows.subspan(i * V, V);
      if (undo) {
        if (undo->rows.capacity() == 0) undo->rows.swap(spare_rows());
        undo->rows.reserve(undo->rows.size() + (n - i) * V);
        undo->rows_at.push_back(i * V);
        undo->rows.insert(undo->rows.end(), row.begin(), row.end());
      }
      const bool stops_allowed = length_ + static_cast<int64_t>(i) >= min_tokens_;
      if (json_) json_->mask(js, row, stop_ids_, stops_allowed);
      else grammar_->mask(gs, row, stop_ids_, stops_allowed);
    }
  }
  // The lists last, so that a row they would leave with no token is the row the grammar left.
  if (lists_)
    for (size_t i = 0; i < n; ++i)
      mask_lists(rows.subspan(i * V, V), ignore_draft ? std::span<const int32_t>{} : draft.first(i), undo, i * V);
  if (!ignore_draft)
    for (size_t i = 1; i < n; ++i) {
      const int32_t t = draft[i - 1];
      if (t >= 0 && t < vocab_) --count_[static_cast<size_t>(t)];
    }
  for (size_t j = touched_before; j < touched_.size(); ++j) {
    const auto at = static_cast<size_t>(touched_[j]);
    if (count_[at] == 0 && !(flags_[at] & kKept)) flags_[at] &= static_cast<uint8_t>(~kTouched);
  }
  // Keep only the tokens still touched (those a draft token made new are dropped again).
  size_t keep = touched_before;
  for (size_t j = touched_before; j < touched_.size(); ++j)
    if (flags_[static_cast<size_t>(touched_[j])] & kTouched) touched_[keep++] = touched_[j];
  touched_.resize(keep);
}

void PenaltyHistory::restore(std::span<float> rows, Undo& undo) {
  if (!undo.rows_at.empty()) {
    const size_t V = undo.rows.size() / undo.rows_at.size();
    for (size_t k = undo.rows_at.size(); k-- > 0;)
      std::copy_n(undo.rows.begin() + static_cast<std::ptrdiff_t>(k * V), V, rows.begin() + static_cast<std::ptrdiff_t>(undo.rows_at[k]));
  }
  for (auto it = undo.saved.rbegin(); it != undo.saved.rend(); ++it) rows[it->first] = it->second;
  undo.clear();
}

PenalizedRows::PenalizedRows(PenaltyHistory* history, std::span<float> rows, std::span<const int32_t> draft) : rows_(rows) {
  if (history != nullptr) history->apply(rows, draft, undo_);
}

PenalizedRows::~PenalizedRows() { PenaltyHistory::restore(rows_, undo_); }

}  // namespace specula
