// Plain generation loop, the baseline every speculative mode is measured against.
#include "spec/generate.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "spec/penalties.h"

namespace specula {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

GenerateStats generate(LlamaModel& model, KvCache& kv, int seq, const GenerateRequest& req, const TokenCallback& on_token) {
  req.sampling.validate(model.config().vocab_size);
  if (req.max_tokens < 1) throw std::invalid_argument("max_tokens must be >= 1, got " + std::to_string(req.max_tokens));
  req.check_min_tokens();
  if (req.prompt.empty()) throw std::invalid_argument("the prompt is empty");
  const int64_t ctx = model.config().max_positions;
  if (ctx > 0 && kv.length(seq) + static_cast<int64_t>(req.prompt.size()) >= ctx)
    throw std::invalid_argument("the prompt has " + std::to_string(kv.length(seq) + req.prompt.size()) +
                                " tokens; the context holds " + std::to_string(ctx));

  GenerateStats st;
  st.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  std::vector<float> logits;
  auto t0 = std::chrono::steady_clock::now();
  ForwardSeq fs{seq, req.prompt, false};
  model.forward({&fs, 1}, kv, logits);
  st.prefill_seconds = seconds_since(t0);

  const FinishRule rule = req.finish_rule(ctx);
  PenaltyHistory penalties(req.sampling, req.prompt, model.config().vocab_size, req.stop_ids);
  auto t1 = std::chrono::steady_clock::now();
  for (;;) {
    const int64_t position = kv.length(seq);  // where the new token will sit
    penalties.apply(logits, {});  // not restored: the next forward overwrites the row
    const int32_t tok = sample_token(logits, req.sampling, position);
    if (penalties.refuses(tok)) throw std::runtime_error(kListsLeaveNoToken);  // as the sampler ends such a request
    penalties.push(tok);
    ++st.generated;
    if (st.generated == 1) t1 = std::chrono::steady_clock::now();
    st.finish_reason = on_token(tok) ? rule.after(tok, st.generated, position, false, penalties.constraint_complete()) : FinishReason::Cancelled;
    if (st.finish_reason != FinishReason::None) break;
    ForwardSeq step{seq, {&tok, 1}, false};
    model.forward({&step, 1}, kv, logits);
  }
  st.decode_seconds = seconds_since(t1);
  return st;
}

std::vector<int32_t> default_stop_ids(const LoadedModel& m, const ChatTemplate* chat) {
  std::vector<int32_t> ids = m.weights.config.eos_ids;
  if (m.tokenizer) {
    for (int32_t e : m.tokenizer->eos_ids()) ids.push_back(e);
    for (const ChatTemplate* t : {&m.chat_template, chat})
      for (const std::string& eot : t ? t->end_of_turn_markers() : std::vector<std::string>{})
        if (const int32_t id = m.tokenizer->token_id(eot); id >= 0) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace specula
