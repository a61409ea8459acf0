// KvLedger: the scheduler's count of KV blocks (kv_ledger.h).
#include "actors/kv_ledger.h"

#include <algorithm>
#include <cassert>

namespace specula::actors {

KvLedger::Holding& KvLedger::at(RequestId id) { return holdings_.at(id); }
const KvLedger::Holding& KvLedger::at(RequestId id) const { return holdings_.at(id); }

void KvLedger::hold(int32_t b) {
  if (holders_[b]++ == 0) ++reserved_;
}

void KvLedger::drop(int32_t b) {
  const auto it = holders_.find(b);
  assert(it != holders_.end());
  if (--it->second == 0) {
    holders_.erase(it);
    --reserved_;
  }
}

void KvLedger::unexpect(int32_t b) {
  if (--expecting_[b] == 0) expecting_.erase(b);
  drop(b);
}

void KvLedger::admit(RequestId id, int64_t own, const std::vector<int32_t>& expected) {
  const auto [it, added] = holdings_.try_emplace(id, Holding{own, {}, expected});
  assert(added);
  reserved_ += own;
  for (const int32_t b : expected) {
    assert(holders_.count(b) && expectable(b));
    hold(b);
    ++expecting_[b];
  }
}

void KvLedger::grow(RequestId id, int64_t more) {
  at(id).own += more;
  reserved_ += more;
}

void KvLedger::settle(RequestId id) {
  Holding& h = at(id);
  for (const int32_t b : h.expected) {
    ++h.own;
    ++reserved_;
    unexpect(b);
  }
  h.expected.clear();
}

void KvLedger::share(RequestId id, const std::vector<int32_t>& registered) {
  Holding& h = at(id);
  for (const int32_t b : registered) {
    assert(h.own > 0);
    --h.own;
    --reserved_;
    h.shared.push_back(b);
    hold(b);
  }
}

void KvLedger::expectations_to_own(int32_t b) {
  for (auto& [id, h] : holdings_) {
    const auto e = std::find(h.expected.begin(), h.expected.end(), b);
    if (e == h.expected.end()) continue;
    h.expected.erase(e);
    ++h.own;
    ++reserved_;
    unexpect(b);
  }
}

void KvLedger::leave(RequestId id) {
  const auto it = holdings_.find(id);
  assert(it != holdings_.end());
  const Holding h = std::move(it->second);
  holdings_.erase(it);
  reserved_ -= h.own;
  for (const int32_t b : h.expected) unexpect(b);
  for (const int32_t b : h.shared) {
    drop(b);
    // Held now only by a request expecting it: nothing keeps the verifier from evicting it.
    const auto held = holders_.find(b);
    const auto expected = expecting_.find(b);
    if (held != holders_.end() && expected != expecting_.end() && held->second == expected->second)
      expectations_to_own(b);
  }
}

int64_t KvLedger::held(RequestId id) const {
  const Holding& h = at(id);
  return h.own + static_cast<int64_t>(h.shared.size() + h.expected.size());
}

const std::vector<int32_t>& KvLedger::shared(RequestId id) const { return at(id).shared; }

std::vector<int64_t> KvLedger::freed_by(const std::vector<RequestId>& ids) const {
  std::unordered_map<int32_t, int> left;  // holders not yet gone, of the blocks these share or expect
  std::vector<int64_t> freed;
  for (const RequestId id : ids) {
    const Holding& h = at(id);
    int64_t n = h.own;
    for (const std::vector<int32_t>* blocks : {&h.shared, &h.expected})
      for (const int32_t b : *blocks) {
        const auto it = left.try_emplace(b, holders_.at(b)).first;
        if (--it->second == 0) ++n;
      }
    freed.push_back(n);
  }
  return freed;
}

}  // namespace specula::actors
