// The scheduler's count of the target's KV blocks, apart from the verifier's pool: each active
// request's own blocks, the registered blocks it shares (counted once however many hold them), and
// those it expects to share when its sequence is made (docs/engine.md, "Shared blocks count once"
// and "Shared blocks charged at admission", which say why the count never falls below the pool's
// use). Thread-safety: none; the scheduler actor owns it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "actors/request_id.h"

namespace specula::actors {

class KvLedger {
 public:
  // Blocks held: each request's own and each shared (or expected) block once.
  int64_t reserved() const { return reserved_; }
  // `id` joins with `own` blocks of its own and expecting to share `expected` (each a block that
  // requests already in share and that is expectable()).
  void admit(RequestId id, int64_t own, const std::vector<int32_t>& expected);
  // `more` own blocks for its next round.
  void grow(RequestId id, int64_t more);
  // The verifier has made its KV sequence: what it expected to share becomes its own (share()
  // names what it does share).
  void settle(RequestId id);
  // Its blocks the verifier has just named registered move from its own to the shared ones.
  void share(RequestId id, const std::vector<int32_t>& registered);
  // It leaves (released or preempted): its own blocks, and each shared one it was the last to hold,
  // go back; a block only expected by others from now on becomes their own.
  void leave(RequestId id);
  // The blocks it holds: own, shared and expected.
  int64_t held(RequestId id) const;
  // Whether a joining request may expect to share `b`, a block the requests in share: no other
  // request expects it.
  bool expectable(int32_t b) const { return !expecting_.count(b); }
  // The registered blocks it shares, in the order of its sequence's block table (from the first).
  const std::vector<int32_t>& shared(RequestId id) const;
  // What letting `ids` leave one after another frees, each: its own blocks, and its shared and
  // expected ones whose other holders are all among those before it.
  std::vector<int64_t> freed_by(const std::vector<RequestId>& ids) const;

 private:
  struct Holding {
    int64_t own = 0;
    std::vector<int32_t> shared{};    // registered blocks of its sequence, its table's first ones
    std::vector<int32_t> expected{};  // blocks others hold that its sequence, once made, will share
  };
  Holding& at(RequestId id);
  const Holding& at(RequestId id) const;
  // One more holder of shared or expected block `b` (counted in reserved_ by its first).
  void hold(int32_t b);
  // One holder fewer; the last gives it back.
  void drop(int32_t b);
  // One request fewer expecting `b`, and one holder fewer.
  void unexpect(int32_t b);
  // Turns every expectation of `b` into an own block of the request expecting it.
  void expectations_to_own(int32_t b);

  std::unordered_map<RequestId, Holding> holdings_;
  std::unordered_map<int32_t, int> holders_;    // shared or expected block -> requests holding it
  std::unordered_map<int32_t, int> expecting_;  // of those, the requests only expecting it
  int64_t reserved_ = 0;
};

}  // namespace specula::actors
