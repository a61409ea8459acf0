// Penalties and logit bias over a request's own tokens (spec/penalties.h).
#include "spec/penalties.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <limits>

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
