// Multi-token exactness of the whole loop: with two tiny random models (different weights, one
// vocabulary of 16), the joint distribution of the first 3 tokens of speculative_generate
// matches target-only sampling, computed exactly by enumerating all 16^3 continuations
// (chi-square over 500k seeded runs). A drafter that misreports q must fail the same test.
// Also: greedy and coupled output equal generate()'s token for token on the tiny pair. The
// trained-head drafter (EAGLE) runs the same tests with a random head over 12 of the 16 tokens
// (the other 4 are never proposed: the residual covers them), and its cache, kept across many
// rounds of rollback, drafts what a fresh one fed the whole context drafts. Prompt lookup in
// front of the head (spec/lookup_first_drafter.h) runs the chi-square and parity tests too, and
// block verification (SpecSampling::Block) the chi-square with the draft model, the head and
// lookup in front of it.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <ostream>
#include <string_view>
#include <thread>

#include "gpu/host/host_device.h"
#include "gpu/llama.h"
#include "spec/eagle_drafter.h"
#include "spec/generate.h"
#include "spec/lookup_first_drafter.h"
#include "spec/model_drafter.h"
#include "spec/ngram_drafter.h"
#include "spec/grammar.h"
#include "spec/json_mode.h"
#include "spec/penalties.h"
#include "spec/speculative_generate.h"
#include "tests/unit/spec/chi_square.h"
#include "tests/unit/spec/draft_probe.h"
#include "tests/unit/spec/tiny_llama.h"

namespace specula {
namespace {

constexpr int64_t kVocab = 16;
constexpr int32_t kPromptToken = 5;
// The stop tokens of the min_tokens cases: held back for the first two tokens, allowed at the third.
const std::vector<int32_t> kStopIds{3, 9};
const int64_t kJointRuns = std::getenv("SPECULA_JOINT_RUNS") ? std::atoll(std::getenv("SPECULA_JOINT_RUNS")) : 500000;

struct TinyPair {
  HostOps ops{1};
  ModelWeights target_w = test::tiny_llama(1, {.layers = 2});
  ModelWeights draft_w = test::tiny_llama(2, {.layers = 1});
  LlamaModel target{target_w, ops};
  LlamaModel draft{draft_w, ops};
  KvCache kv{ops, target.kv_config(256)};
  int seq = kv.create_sequence();
};

// P(x1 x2 x3 | prompt) under target-only sampling with `sp`: 1 + 16 + 256 forwards. With
// penalties, each row is adjusted by the output before it (x1, then x1 x2), as generate() does.
std::vector<double> target_joint(TinyPair& m, const SamplingParams& sp) {
  std::vector<double> joint(kVocab * kVocab * kVocab, 0.0);
  std::vector<float> logits, p1, p2, p3;
  const std::vector<int32_t> prompt{kPromptToken};
  auto next = [&](int32_t tok, std::vector<float>& probs, std::vector<int32_t> output) {
    ForwardSeq fs{m.seq, {&tok, 1}, false};
    m.target.forward({&fs, 1}, m.kv, logits);
    PenaltyHistory history(sp, prompt, kVocab, sp.min_tokens > 0 ? kStopIds : std::vector<int32_t>{});
    for (int32_t t : output) history.push(t);
    PenaltyHistory::Undo undo;
    history.apply(logits, {}, undo);
    transform_to_probs(logits, sp, probs);
  };
  m.kv.truncate_to(m.seq, 0);
  next(kPromptToken, p1, {});
  for (int32_t a = 0; a < kVocab; ++a) {
    if (p1[a] == 0) continue;
    m.kv.truncate_to(m.seq, 1);
    next(a, p2, {a});
    for (int32_t b = 0; b < kVocab; ++b) {
      if (p2[b] == 0) continue;
      m.kv.truncate_to(m.seq, 2);
      next(b, p3, {a, b});
      for (int32_t c = 0; c < kVocab; ++c)
        joint[(a * kVocab + b) * kVocab + c] = static_cast<double>(p1[a]) * p2[b] * p3[c];
    }
  }
  m.kv.truncate_to(m.seq, 0);
  return joint;
}

// The planted bug for the negative control: a drafter whose reported q is not the distribution
// it sampled from (as if the transform were applied twice: q^2, renormalised).
class MisreportingDrafter final : public Drafter {
 public:
  explicit MisreportingDrafter(LlamaModel& draft) : inner_(draft, 256) {}
  std::string name() const override { return "misreporting"; }
  void prefill(std::span<const int32_t> c) override { inner_.prefill(c); }
  void rollback(int64_t n) override { inner_.rollback(n); }
  void propose(const DraftRequest& req, DraftProposal& out) override {
    inner_.propose(req, out);
    for (int64_t i = 0; i < out.k(); ++i) {
      float* q = out.q.data() + i * kVocab;
      double s = 0;
      for (int64_t v = 0; v < kVocab; ++v) s += static_cast<double>(q[v]) * q[v];
      for (int64_t v = 0; v < kVocab; ++v) q[v] = static_cast<float>(q[v] * q[v] / s);
    }
  }

 private:
  ModelDrafter inner_;
};

// A random draft head of `layers` decoder layers for the tiny target (hidden 32, 2 heads of 16, 1
// kv head) over a reduced vocabulary of 12 of the 16 tokens, in memory (no file, so no target
// hash to check).
std::shared_ptr<const EagleHead> tiny_head(uint64_t seed, int layers = 1) {
  auto h = std::make_shared<EagleHead>();
  auto store = std::make_shared<ModelWeights>();  // owns the tensors' data
  test::TinyLlamaBuilder b(seed);
  auto matrix = [&](std::vector<int64_t> shape, float std) { return b.tensor(*store, "w", std::move(shape), std, false); };
  auto norm = [&] { return b.tensor(*store, "norm", {32}, 0, true); };
  LlamaConfig& c = h->config;
  c.architecture = "specula-eagle";
  c.layers = layers;
  c.hidden = 32;
  c.intermediate = 32;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 16;
  c.rope_style = RopeStyle::Interleaved;
  c.max_positions = 4096;
  h->n_vocab = c.vocab_size = 12;
  h->token_map = {0, 2, 3, 5, 6, 7, 9, 10, 11, 12, 14, 15};
  const float s32 = 1.0f / std::sqrt(32.0f);
  h->fc = matrix({32, 64}, 1.0f / 8.0f);
  for (int l = 0; l < layers; ++l) {
    LayerWeights& lw = h->layers.emplace_back();
    lw.attn_norm = norm();
    lw.wq = matrix({32, 32}, s32);
    lw.wk = matrix({16, 32}, s32);
    lw.wv = matrix({16, 32}, s32);
    lw.wo = matrix({32, 32}, s32);
    lw.ffn_norm = norm();
    lw.w_gate = matrix({32, 32}, s32);
    lw.w_up = matrix({32, 32}, s32);
    lw.w_down = matrix({32, 32}, s32);
  }
  h->out_norm = norm();
  h->out = matrix({12, 32}, 1.5f * s32);
  // The views point into `store`; the head keeps it alive through an aliasing file handle.
  h->file = std::shared_ptr<const GgufFile>(store, nullptr);
  return h;
}

// The random head's weights on m's device, over m's target.
std::shared_ptr<const EagleWeights> tiny_eagle_weights(TinyPair& m, int layers = 1) {
  LoadedModel target;
  target.weights = m.target_w;  // EagleWeights reads the embedding and the vocabulary size
  return std::make_shared<EagleWeights>(tiny_head(7, layers), target, m.ops);
}

std::unique_ptr<Drafter> eagle_drafter(TinyPair& m) { return std::make_unique<EagleDrafter>(tiny_eagle_weights(m), 256); }
std::unique_ptr<Drafter> two_layer_eagle_drafter(TinyPair& m) {
  return std::make_unique<EagleDrafter>(tiny_eagle_weights(m, 2), 256);
}

using MakeDrafter = std::function<std::unique_ptr<Drafter>(TinyPair&)>;

struct JointRun {
  test::ChiSquare chi;
  int64_t rounds = 0, drafted = 0, accepted = 0;
  int64_t moved = 0;  // runs whose confidence threshold left its starting value (the automatic one)
  // Runs that drew a token their allowed_token_ids and bad_words refuse (speculative_generate
  // throws): none unless a bug let the rows lose their masks. Left out of the counts.
  int64_t refused = 0;
};

// `n` speculative runs with seeds 0..n-1, each cut after its first 3 tokens, counted over the
// 16^3 outcomes. Two threads, each with its own models and caches, take alternate seeds (the
// counts do not depend on the split).
JointRun speculative_joint(const MakeDrafter& make, const SamplingParams& sp, int k, int64_t n, float max_entropy = 0,
                           float min_confidence = 0, bool confidence_auto = false,
                           SpecSampling mode = SpecSampling::Exact, const SamplingParams* reference = nullptr) {
  constexpr int kThreads = 2;
  std::vector<std::vector<int64_t>> counts(kThreads, std::vector<int64_t>(kVocab * kVocab * kVocab, 0));
  std::vector<JointRun> runs(kThreads);
  auto work = [&](int tid) {
    TinyPair m;
    std::unique_ptr<Drafter> drafter = make(m);
    SpeculativeRequest req;
    req.prompt = {kPromptToken};
    req.max_tokens = 16;  // never clamps K: the run is cancelled after 3 tokens
    req.sampling = sp;
    if (sp.min_tokens > 0) req.stop_ids = kStopIds;  // a stop token may end a run at its third token
    req.mode = mode;
    req.draft.k = k;
    req.draft.max_entropy = max_entropy;
    req.draft.min_confidence = min_confidence;
    // The automatic threshold without a warm-up, so that a 3-token run's later rounds draft at the
    // thresholds its own first rounds measured (they depend on timing: any value must keep the
    // output exact, as the rule never looks at the token it decides on).
    req.draft.confidence_auto = confidence_auto;
    req.draft.confidence_warmup = 0;
    if (confidence_auto) {  // it follows timing only with adaptive K (at K_max with the rule on)
      req.draft.adaptive = true;
      req.draft.k_min = 1;
      req.draft.k_max = k;
    }
    std::vector<int32_t> out;
    for (int64_t s = tid; s < n; s += kThreads) {
      req.sampling.seed = static_cast<uint64_t>(s);
      m.kv.truncate_to(m.seq, 0);
      out.clear();
      SpeculativeStats st;
      try {
        st = speculative_generate(m.target, m.kv, m.seq, *drafter, req, [&](int32_t t, TokenOrigin) {
          out.push_back(t);
          return out.size() < 3;
        });
      } catch (const std::runtime_error& e) {
        if (std::string_view(e.what()) != kListsLeaveNoToken) throw;
        ++runs[tid].refused;
        drafter = make(m);  // its state is mid-round
        continue;
      }
      ++counts[tid][static_cast<size_t>((out[0] * kVocab + out[1]) * kVocab + out[2])];
      runs[tid].rounds += st.rounds;
      runs[tid].drafted += st.drafted;
      runs[tid].accepted += st.accepted;
      if (st.confidence_rounds > 0 && st.mean_confidence_threshold() != static_cast<double>(min_confidence)) ++runs[tid].moved;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < kThreads; ++t) threads.emplace_back(work, t);
  work(0);
  for (auto& t : threads) t.join();
  JointRun total;
  std::vector<int64_t> merged(kVocab * kVocab * kVocab, 0);
  for (int t = 0; t < kThreads; ++t) {
    for (size_t i = 0; i < merged.size(); ++i) merged[i] += counts[t][i];
    total.rounds += runs[t].rounds;
    total.drafted += runs[t].drafted;
    total.accepted += runs[t].accepted;
    total.moved += runs[t].moved;
    total.refused += runs[t].refused;
  }
  TinyPair m;
  total.chi = test::chi_square_test(merged, target_joint(m, reference ? *reference : sp), n);
  return total;
}

std::unique_ptr<Drafter> draft_model(TinyPair& m) { return std::make_unique<ModelDrafter>(m.draft, 256); }

// Penalties strong enough to move the tiny target's joint a long way (the controls below fail
// without them): presence 0.8, frequency 0.6, repetition 1.5; and with logit bias under top-k /
// top-p at T 0.7.
const SamplingParams kPenalized{1.0f, 0, 1.0f, 0, 0.0f, 0.8f, 0.6f, 1.5f, {}};
// min_tokens 2 with stop tokens 3 and 9 (kStopIds): neither can be the first or second token.
const SamplingParams kMinTokens{1.0f, 0, 1.0f, 0, 0.0f, 0.0f, 0.0f, 1.0f, {}, 2};
const SamplingParams kPenalizedTopKTopP{0.7f, 8, 0.9f, 0, 0.0f, -0.5f, 0.7f, 1.3f, {{2, 1.5f}, {9, -2.0f}}};

const std::vector<std::string> kJsonTokens = {"{", "}", "\"", "a", ":", "1", ",", " ", "[", "]", "\"a\"", "{\"", "0", "-", "true", "\":"};
// JSON mode on the tiny vocabulary (spec/json_mode.h), 16 tokens of JSON's syntax: after "{" the
// first three tokens take few of the 16^3 outcomes, and the draft model's rows are masked too.
SamplingParams json_mode(float temperature, float top_p = 1.0f) {
  static const auto vocab = std::make_shared<const JsonVocabulary>(kJsonTokens);
  SamplingParams sp{temperature, 0, top_p, 0};
  sp.json_object = vocab;
  return sp;
}

// A grammar on the tiny vocabulary (spec/grammar.h): pairs of tokens, the second forced by the
// first, so that each row's mask turns on the tokens before it, drafts included.
SamplingParams grammar_mode(float temperature, float top_p = 1.0f) {
  static const auto matcher = std::make_shared<const GrammarMatcher>(
      Grammar::parse(R"(root ::= ("a" ":" | "1" "," | "{" "}" | "-" "0" | " " "[" | "true" " ")+)"),
      std::make_shared<const TokenTrie>(kJsonTokens));
  SamplingParams sp{temperature, 0, top_p, 0};
  sp.grammar = matcher;
  return sp;
}

// A grammar under which prompt lookup proposes both tokens it keeps and tokens it refuses on the
// tiny vocabulary (the prompt is "1": after "," "1" the lookup proposes "," and "1", which it keeps;
// after an output "1" it proposes "1", which it refuses).
SamplingParams lookup_grammar_mode(float temperature) {
  static const auto matcher = std::make_shared<const GrammarMatcher>(Grammar::parse(R"(root ::= ("a" | "1" "," | "," "1")+)"),
                                                                     std::make_shared<const TokenTrie>(kJsonTokens));
  SamplingParams sp{temperature, 0, 1.0f, 0};
  sp.grammar = matcher;
  return sp;
}

// vLLM's allowed_token_ids and bad_words on the tiny vocabulary: tokens 7 and 11 never, token 5
// never, no token twice in a row, and 3 never after 2 (so each row's mask turns on the token
// before it, drafts included).
SamplingParams lists_mode(float temperature, float top_p = 1.0f) {
  SamplingParams sp{temperature, 0, top_p, 0};
  for (int32_t t = 0; t < kVocab; ++t)
    if (t != 7 && t != 11) sp.allowed_token_ids.push_back(t);
  sp.bad_words = {{5}, {2, 3}};
  for (int32_t t = 0; t < kVocab; ++t) sp.bad_words.push_back({t, t});
  return sp;
}

struct Case {
  int k;
  SamplingParams sp;
  float max_entropy = 0;
  float min_confidence = 0;
  bool confidence_auto = false;
};

// gtest prints a case by its K and settings (its default dumps the bytes, pointers and all).
void PrintTo(const Case& c, std::ostream* os) {
  *os << "K " << c.k << ", T " << c.sp.temperature << ", top-k " << c.sp.top_k << ", top-p " << c.sp.top_p << ", min-p "
      << c.sp.min_p << ", penalties " << c.sp.presence_penalty << "/" << c.sp.frequency_penalty << "/"
      << c.sp.repetition_penalty << ", " << c.sp.logit_bias.size() << " biased tokens" << (c.sp.json_object ? ", JSON mode" : "")
      << (c.sp.grammar ? ", a grammar" : "");
}

class JointOfThreeTokens : public ::testing::TestWithParam<Case> {};

TEST_P(JointOfThreeTokens, MatchesTargetOnlySampling) {
  const Case c = GetParam();
  const JointRun r = speculative_joint(draft_model, c.sp, c.k, kJointRuns, c.max_entropy, c.min_confidence, c.confidence_auto);
  EXPECT_TRUE(r.chi.pass()) << r.chi.str();
  EXPECT_EQ(r.refused, 0);
  std::printf("[ stats    ] %s; %lld rounds, %lld drafted, %lld accepted\n", r.chi.str().c_str(),
              static_cast<long long>(r.rounds), static_cast<long long>(r.drafted), static_cast<long long>(r.accepted));
  // The draft must be exercised: tokens accepted and tokens rejected.
  EXPECT_GT(r.accepted, r.rounds / 4) << r.accepted << " accepted in " << r.rounds << " rounds";
  EXPECT_LT(r.accepted, r.drafted);
  // A rule that ends drafts early must have ended some (and not all at the first token).
  if (c.max_entropy > 0 || c.min_confidence > 0) {
    EXPECT_LT(r.drafted, r.rounds * c.k);
    EXPECT_GT(r.drafted, r.rounds);
  }
  if (c.confidence_auto) {
    EXPECT_GT(r.moved, kJointRuns / 10) << "the automatic threshold never left its start";
  }
}

// Every K in {1, 3, 5} at both temperatures (1.0 and 0.7), top-k / top-p with each K, and min-p
// alone and under top-p at K 3; one
// cuts drafts at entropy 1.0 nats, one where the product of the tokens' q falls below 0.05, one
// where it falls below the automatic threshold (starting at 0.3).
INSTANTIATE_TEST_SUITE_P(KAndTransforms, JointOfThreeTokens,
                         ::testing::Values(Case{1, {1.0f, 0, 1.0f, 0}}, Case{1, {0.7f, 0, 1.0f, 0}},
                                           Case{3, {1.0f, 0, 1.0f, 0}}, Case{3, {0.7f, 0, 1.0f, 0}},
                                           Case{5, {1.0f, 0, 1.0f, 0}}, Case{5, {0.7f, 0, 1.0f, 0}},
                                           Case{1, {0.7f, 6, 0.9f, 0}},
                                           Case{3, {1.0f, 8, 0.9f, 0}}, Case{5, {0.7f, 8, 0.8f, 0}, 1.0f},
                                           Case{5, {0.7f, 0, 1.0f, 0}, 0, 0.05f},
                                           Case{5, {0.7f, 0, 1.0f, 0}, 0, 0.3f, true},
                                           Case{3, {1.0f, 0, 1.0f, 0, 0.1f}}, Case{3, {0.7f, 0, 0.9f, 0, 0.05f}},
                                           Case{3, kPenalized}, Case{5, kPenalizedTopKTopP}, Case{4, kMinTokens},
                                           Case{3, json_mode(1.0f)}, Case{5, json_mode(0.7f, 0.9f)},
                                           Case{3, grammar_mode(1.0f)}, Case{4, grammar_mode(0.7f, 0.9f)},
                                           Case{3, lists_mode(1.0f)}, Case{5, lists_mode(0.7f, 0.9f)}),
                         [](const auto& info) {
                           const Case& c = info.param;
                           std::string n = "K" + std::to_string(c.k) + "_T" + std::to_string(static_cast<int>(c.sp.temperature * 10));
                           if (c.sp.top_k) n += "_topk" + std::to_string(c.sp.top_k);
                           if (c.sp.top_p < 1) n += "_topp" + std::to_string(static_cast<int>(c.sp.top_p * 100));
                           if (c.sp.min_p > 0) n += "_minp" + std::to_string(static_cast<int>(c.sp.min_p * 100));
                           if (c.sp.json_object) n += "_json";
                           else if (c.sp.grammar) n += "_grammar";
                           else if (!c.sp.allowed_token_ids.empty() || !c.sp.bad_words.empty()) n += "_lists";
                           else if (c.sp.penalized()) n += "_penalties";
                           if (!c.sp.logit_bias.empty()) n += "_bias";
                           if (c.sp.min_tokens > 0) n += "_mintokens" + std::to_string(c.sp.min_tokens);
                           if (c.max_entropy > 0) n += "_entropy";
                           if (c.min_confidence > 0) n += "_confidence";
                           if (c.confidence_auto) n += "_auto";
                           return n;
                         });

// The trained-head drafter: a random head over 12 of the 16 tokens, at K 3 and 5, with and
// without top-k / top-p. The prompt is one token, so the first round drafts nothing (the head
// needs the target's row of the prompt) and the later ones draft from the rows each verdict
// hands over.
TEST(JointOfThreeTokensEagle, TheHeadDrafterMatchesTargetOnlySampling) {
  for (const auto& [k, sp] : {std::pair{3, SamplingParams{1.0f, 0, 1.0f, 0}}, std::pair{5, SamplingParams{0.7f, 8, 0.9f, 0}}}) {
    const JointRun r = speculative_joint(eagle_drafter, sp, k, kJointRuns);
    EXPECT_TRUE(r.chi.pass()) << "K " << k << ": " << r.chi.str();
    std::printf("[ stats    ] eagle K %d: %s; %lld rounds, %lld drafted, %lld accepted\n", k, r.chi.str().c_str(),
                static_cast<long long>(r.rounds), static_cast<long long>(r.drafted), static_cast<long long>(r.accepted));
    // Exercised: a random head is accepted now and then, and rejected more often.
    EXPECT_GT(r.accepted, r.drafted / 100) << r.accepted << " accepted of " << r.drafted << " drafted";
    EXPECT_LT(r.accepted, r.drafted);
  }
}

// A head of two decoder layers (each with its own cache layer): the same exactness.
TEST(JointOfThreeTokensEagle, AHeadOfTwoLayersMatchesTargetOnlySampling) {
  const JointRun r = speculative_joint(two_layer_eagle_drafter, SamplingParams{1.0f, 0, 1.0f, 0}, 4, kJointRuns);
  EXPECT_TRUE(r.chi.pass()) << r.chi.str();
  std::printf("[ stats    ] eagle, 2 layers, K 4: %s; %lld rounds, %lld drafted, %lld accepted\n", r.chi.str().c_str(),
              static_cast<long long>(r.rounds), static_cast<long long>(r.drafted), static_cast<long long>(r.accepted));
  EXPECT_GT(r.accepted, r.drafted / 100) << r.accepted << " accepted of " << r.drafted << " drafted";
  EXPECT_LT(r.accepted, r.drafted);
}

// Prompt lookup in front of the head (`ngram:n=2,min=1+eagle`): with 16 tokens the context's last
// token often recurs, so rounds go to both drafters, chosen by the context alone (and, under a
// grammar, by what the grammar keeps after it).
std::atomic<int64_t> lookup_rounds{0}, head_rounds{0};

class TalliedLookupFirst final : public Drafter {
 public:
  explicit TalliedLookupFirst(TinyPair& m) : d_(NgramDrafter(kVocab, 2, 1), eagle_drafter(m)) {}
  ~TalliedLookupFirst() override {
    lookup_rounds += d_.lookup_rounds();
    head_rounds += d_.other_rounds();
  }
  std::string name() const override { return d_.name(); }
  void prefill(std::span<const int32_t> c) override { d_.prefill(c); }
  void propose(const DraftRequest& req, DraftProposal& out) override { d_.propose(req, out); }
  void rollback(int64_t n) override { d_.rollback(n); }
  bool wants_target_hidden() const override { return d_.wants_target_hidden(); }
  std::vector<int> target_feature_layers() const override { return d_.target_feature_layers(); }
  void target_hidden(int64_t first, std::span<const float> rows) override { d_.target_hidden(first, rows); }

 private:
  LookupFirstDrafter d_;
};

TEST(JointOfThreeTokensLookupFirst, PromptLookupInFrontOfTheHeadMatchesTargetOnlySampling) {
  // The third: under a grammar, where prompt lookup's proposal ends before the first token the
  // grammar refuses there (and the head drafts where that leaves none).
  for (const auto& [k, sp] : {std::pair{3, SamplingParams{1.0f, 0, 1.0f, 0}}, std::pair{4, SamplingParams{0.7f, 8, 0.9f, 0}},
                              std::pair{3, lookup_grammar_mode(1.0f)}}) {
    lookup_rounds = head_rounds = 0;
    const JointRun r = speculative_joint([](TinyPair& m) { return std::make_unique<TalliedLookupFirst>(m); }, sp, k, kJointRuns);
    EXPECT_TRUE(r.chi.pass()) << "K " << k << ": " << r.chi.str();
    std::printf("[ stats    ] lookup+eagle K %d: %s; %lld rounds (%lld by lookup, %lld by the head), %lld drafted, %lld accepted\n",
                k, r.chi.str().c_str(), static_cast<long long>(r.rounds), static_cast<long long>(lookup_rounds.load()),
                static_cast<long long>(head_rounds.load()), static_cast<long long>(r.drafted), static_cast<long long>(r.accepted));
    // Both drafters drafted a good share of the rounds (prompt lookup a smaller one inside the
    // grammar, whose three-token outputs seldom repeat a token it keeps), and drafts were
    // accepted and rejected.
    EXPECT_GT(lookup_rounds.load(), sp.grammar ? r.rounds / 100 : r.rounds / 20);
    EXPECT_GT(head_rounds.load(), r.rounds / 20);
    EXPECT_GT(r.accepted, r.drafted / 100);
    EXPECT_LT(r.accepted, r.drafted);
  }
}

TEST(JointOfThreeTokensControl, ADrafterThatMisreportsQFailsTheTest) {
  const JointRun r = speculative_joint([](TinyPair& m) { return std::make_unique<MisreportingDrafter>(m.draft); },
                                       SamplingParams{1.0f, 0, 1.0f, 0}, 3, 200000);
  EXPECT_FALSE(r.chi.pass()) << "the planted bug went unnoticed: " << r.chi.str();
  std::printf("[ stats    ] planted bug: %s\n", r.chi.str().c_str());
}

// The min-p cases are not vacuous: on the tiny target, min-p 0.1 changes the joint enough that
// runs which forget it (a verifier and drafter judging without min-p) fail against it.
TEST(JointOfThreeTokensControl, RunsThatIgnoreMinPFailAgainstTheMinPJoint) {
  const SamplingParams with_min_p{1.0f, 0, 1.0f, 0, 0.1f}, without{1.0f, 0, 1.0f, 0};
  const JointRun r = speculative_joint(draft_model, without, 3, 100000, 0, 0, false, SpecSampling::Exact, &with_min_p);
  EXPECT_FALSE(r.chi.pass()) << "min-p left out went unnoticed: " << r.chi.str();
  std::printf("[ stats    ] min-p left out: %s\n", r.chi.str().c_str());
}

// The penalty cases are not vacuous: runs that leave the penalties out fail against the penalized
// joint; and a verifier that adjusts every row of a round by the output before the round (the
// round's own draft tokens left out of its later rows: test_seams::set_penalties_ignore_draft)
// fails it too, so the chi-square sees the rows' per-position history.
TEST(JointOfThreeTokensControl, RunsThatIgnorePenaltiesFailAgainstThePenalizedJoint) {
  const SamplingParams without{1.0f, 0, 1.0f, 0};
  const JointRun r = speculative_joint(draft_model, without, 3, 100000, 0, 0, false, SpecSampling::Exact, &kPenalized);
  EXPECT_FALSE(r.chi.pass()) << "penalties left out went unnoticed: " << r.chi.str();
  std::printf("[ stats    ] penalties left out: %s\n", r.chi.str().c_str());
}

TEST(JointOfThreeTokensControl, AVerifierThatLeavesTheRoundsDraftsOutOfItsLaterRowsPenaltiesFails) {
  test_seams::set_penalties_ignore_draft(true);
  const JointRun r = speculative_joint(draft_model, kPenalized, 3, 200000);
  test_seams::set_penalties_ignore_draft(false);
  EXPECT_FALSE(r.chi.pass()) << "the planted bug went unnoticed: " << r.chi.str();
  std::printf("[ stats    ] penalties without the round's drafts: %s; %lld drafted, %lld accepted\n", r.chi.str().c_str(),
              static_cast<long long>(r.drafted), static_cast<long long>(r.accepted));
}

// JSON mode's masks too are per row: a verifier that masks every row of a round as its first (the
// round's draft tokens left out of the grammar's state) fails against the JSON-mode joint.
TEST(JointOfThreeTokensControl, AVerifierThatLeavesTheRoundsDraftsOutOfItsLaterRowsJsonMasksFails) {
  test_seams::set_penalties_ignore_draft(true);
  const JointRun r = speculative_joint(draft_model, json_mode(1.0f), 3, 200000);
  test_seams::set_penalties_ignore_draft(false);
  EXPECT_FALSE(r.chi.pass()) << "the planted bug went unnoticed: " << r.chi.str();
  std::printf("[ stats    ] JSON masks without the round's drafts: %s; %lld drafted, %lld accepted\n", r.chi.str().c_str(),
              static_cast<long long>(r.drafted), static_cast<long long>(r.accepted));
}

TEST(JointOfThreeTokensControl, AVerifierThatLeavesTheRoundsDraftsOutOfItsLaterRowsGrammarMasksFails) {
  test_seams::set_penalties_ignore_draft(true);
  const JointRun r = speculative_joint(draft_model, grammar_mode(1.0f), 3, 200000);
  test_seams::set_penalties_ignore_draft(false);
  EXPECT_FALSE(r.chi.pass()) << "the planted bug went unnoticed: " << r.chi.str();
  std::printf("[ stats    ] grammar masks without the round's drafts: %s; %lld drafted, %lld accepted\n", r.chi.str().c_str(),
              static_cast<long long>(r.drafted), static_cast<long long>(r.accepted));
}

// allowed_token_ids and bad_words too: a verifier that masks every row of a round as its first
// (the round's drafts left out of the history the bad words are matched against) fails.
TEST(JointOfThreeTokensControl, AVerifierThatLeavesTheRoundsDraftsOutOfItsLaterRowsBadWordsFails) {
  test_seams::set_penalties_ignore_draft(true);
  const JointRun r = speculative_joint(draft_model, lists_mode(1.0f), 3, 200000);
  test_seams::set_penalties_ignore_draft(false);
  EXPECT_FALSE(r.chi.pass()) << "the planted bug went unnoticed: " << r.chi.str();
  std::printf("[ stats    ] bad words without the round's drafts: %s; %lld drafted, %lld accepted, %lld runs refused\n",
              r.chi.str().c_str(), static_cast<long long>(r.drafted), static_cast<long long>(r.accepted),
              static_cast<long long>(r.refused));
}

// The head drafts inside a grammar (its tokens the grammar refuses at -inf) and stays exact.
TEST(JointOfThreeTokensEagle, TheHeadDraftingInsideAGrammarMatchesTargetOnlySampling) {
  const JointRun r = speculative_joint(eagle_drafter, grammar_mode(1.0f), 3, kJointRuns);
  EXPECT_TRUE(r.chi.pass()) << r.chi.str();
  EXPECT_GT(r.accepted, r.drafted / 100);
  std::printf("[ stats    ] grammar, eagle K 3: %s; %lld drafted, %lld accepted\n", r.chi.str().c_str(),
              static_cast<long long>(r.drafted), static_cast<long long>(r.accepted));
}

// And under allowed_token_ids and bad_words (the tokens they refuse after its history at -inf).
TEST(JointOfThreeTokensEagle, TheHeadDraftingUnderAllowedTokenIdsAndBadWordsMatchesTargetOnlySampling) {
  const JointRun r = speculative_joint(eagle_drafter, lists_mode(1.0f), 4, kJointRuns);
  EXPECT_TRUE(r.chi.pass()) << r.chi.str();
  EXPECT_EQ(r.refused, 0);
  EXPECT_GT(r.accepted, r.drafted / 100);
  std::printf("[ stats    ] lists, eagle K 4: %s; %lld drafted, %lld accepted\n", r.chi.str().c_str(),
              static_cast<long long>(r.drafted), static_cast<long long>(r.accepted));
}

TEST(JointOfThreeTokensEagle, TheHeadAndBlockVerificationMatchTargetOnlySamplingWithPenalties) {
  const JointRun e = speculative_joint(eagle_drafter, kPenalizedTopKTopP, 4, kJointRuns);
  EXPECT_TRUE(e.chi.pass()) << "eagle: " << e.chi.str();
  EXPECT_GT(e.accepted, e.drafted / 100);
  const JointRun b = speculative_joint(draft_model, kPenalized, 4, kJointRuns, 0, 0, false, SpecSampling::Block);
  EXPECT_TRUE(b.chi.pass()) << "block: " << b.chi.str();
  std::printf("[ stats    ] penalties, eagle K 4: %s; block K 4: %s\n", e.chi.str().c_str(), b.chi.str().c_str());
}

// Block verification (SpecSampling::Block) judges the same drafts as a whole: the draft model at
// K 3 and 5 (with top-k / top-p), the head (q zero outside its 12 tokens) at K 4, and prompt
// lookup's one-hot q in front of the head. It must keep more draft tokens than the token rule on
// the same seeds (it never keeps fewer on average; from K 2 on, more where draft and target
// disagree), and the misreporting drafter must fail it too.
TEST(JointOfThreeTokensBlock, BlockVerificationMatchesTargetOnlySampling) {
  struct Run { const char* name; MakeDrafter make; int k; SamplingParams sp; };
  const Run runs[] = {{"draft model", draft_model, 3, {1.0f, 0, 1.0f, 0}},
                      {"draft model", draft_model, 5, {0.7f, 8, 0.9f, 0}},
                      {"eagle", eagle_drafter, 4, {1.0f, 0, 1.0f, 0}},
                      {"lookup+eagle", [](TinyPair& m) { return std::make_unique<TalliedLookupFirst>(m); }, 4, {0.7f, 8, 0.9f, 0}}};
  for (const Run& run : runs) {
    const JointRun b = speculative_joint(run.make, run.sp, run.k, kJointRuns, 0, 0, false, SpecSampling::Block);
    EXPECT_TRUE(b.chi.pass()) << run.name << " K " << run.k << ": " << b.chi.str();
    const JointRun t = speculative_joint(run.make, run.sp, run.k, kJointRuns / 5);
    const double kept_block = static_cast<double>(b.accepted) / b.rounds, kept_token = static_cast<double>(t.accepted) / t.rounds;
    std::printf("[ stats    ] block, %s K %d: %s; %lld rounds, %lld drafted, %lld accepted; %.4f kept a round against the "
                "token rule's %.4f\n", run.name, run.k, b.chi.str().c_str(), static_cast<long long>(b.rounds),
                static_cast<long long>(b.drafted), static_cast<long long>(b.accepted), kept_block, kept_token);
    EXPECT_GT(kept_block, kept_token) << run.name << " K " << run.k;
    EXPECT_LT(b.accepted, b.drafted);
  }
}

TEST(JointOfThreeTokensControl, ADrafterThatMisreportsQFailsTheBlockRuleToo) {
  const JointRun r = speculative_joint([](TinyPair& m) { return std::make_unique<MisreportingDrafter>(m.draft); },
                                       SamplingParams{1.0f, 0, 1.0f, 0}, 3, 200000, 0, 0, false, SpecSampling::Block);
  EXPECT_FALSE(r.chi.pass()) << "the planted bug went unnoticed: " << r.chi.str();
  std::printf("[ stats    ] planted bug, block rule: %s\n", r.chi.str().c_str());
}

// generate() and speculative_generate() on the same tiny target, token for token, for each
// kind of drafter: an unrelated model, the target itself, the target with a layer skipped,
// prompt lookup, the head, prompt lookup in front of the head, and a head with a 2-entry
// catch-up window.
void expect_same_as_generate(const SamplingParams& sp, SpecSampling mode, int k) {
  TinyPair m;
  ModelDrafter unrelated(m.draft, 256), itself(m.target, 256), skip(m.target, 256, {false, true});
  NgramDrafter ngram(kVocab, 3);
  const std::unique_ptr<Drafter> eagle = eagle_drafter(m);
  LookupFirstDrafter lookup_first(NgramDrafter(kVocab, 2), eagle_drafter(m));
  EagleDrafter windowed(tiny_eagle_weights(m), 256, 2);  // restarts often
  GenerateRequest g;
  g.prompt = {3, 9, 1, 3, 9};
  g.max_tokens = 40;
  g.sampling = sp;
  SpeculativeRequest s;
  static_cast<GenerateRequest&>(s) = g;
  s.draft.k = k;
  s.mode = mode;
  for (Drafter* drafter : std::initializer_list<Drafter*>{&unrelated, &itself, &skip, &ngram, eagle.get(), &lookup_first, &windowed}) {
    int64_t accepted = 0;
    for (uint64_t seed = 0; seed < (sp.greedy() ? 1 : 50); ++seed) {
      g.sampling.seed = s.sampling.seed = seed;
      std::vector<int32_t> want, got;
      m.kv.truncate_to(m.seq, 0);
      generate(m.target, m.kv, m.seq, g, [&](int32_t t) { want.push_back(t); return true; });
      m.kv.truncate_to(m.seq, 0);
      accepted += speculative_generate(m.target, m.kv, m.seq, *drafter, s, [&](int32_t t, TokenOrigin) {
        got.push_back(t);
        return true;
      }).accepted;
      ASSERT_EQ(got, want) << drafter->name() << ", seed " << seed;
    }
    if (drafter == &itself) {
      EXPECT_GT(accepted, 0) << "the target drafting for itself must be accepted";
    }
    if (drafter == eagle.get() && !sp.greedy()) {
      EXPECT_GT(accepted, 0) << "the random head is never accepted: it is not drafting";
    }
  }
  EXPECT_GT(lookup_first.lookup_rounds(), 0);
  EXPECT_GT(lookup_first.other_rounds(), 0);
}

TEST(TinyModels, GreedySpeculativeOutputEqualsTargetOnlyGreedy) {
  expect_same_as_generate(SamplingParams{0.0f, 0, 1.0f, 0}, SpecSampling::Exact, 4);
}

// generate()'s 40 tokens after the tiny tests' prompt with `sp`.
std::vector<int32_t> target_only_text(TinyPair& m, const SamplingParams& sp) {
  GenerateRequest g;
  g.prompt = {3, 9, 1, 3, 9};
  g.max_tokens = 40;
  g.sampling = sp;
  std::vector<int32_t> out;
  m.kv.truncate_to(m.seq, 0);
  generate(m.target, m.kv, m.seq, g, [&](int32_t t) { out.push_back(t); return true; });
  m.kv.truncate_to(m.seq, 0);
  return out;
}

// Penalties change greedy text (on the tiny target, repeats are what greedy decoding makes), and
// speculative greedy and coupled text with them equal generate()'s with them.
TEST(TinyModels, WithPenaltiesGreedyAndCoupledOutputEqualTargetOnlyOutput) {
  const SamplingParams greedy{0.0f, 0, 1.0f, 0, 0.0f, 0.4f, 0.3f, 1.2f, {{4, 1.0f}}};
  TinyPair m;
  const std::vector<int32_t> plain = target_only_text(m, SamplingParams{0.0f, 0, 1.0f, 0}), penalized = target_only_text(m, greedy);
  EXPECT_NE(plain, penalized) << "the penalties changed nothing: the test below would prove nothing";
  expect_same_as_generate(greedy, SpecSampling::Exact, 4);
  expect_same_as_generate(SamplingParams{0.8f, 0, 0.95f, 0, 0.0f, 0.8f, 0.6f, 1.5f, {}}, SpecSampling::Coupled, 4);
}

// allowed_token_ids and bad_words change greedy text (the tiny target repeats tokens; the lists
// forbid a token twice in a row), and speculative greedy and coupled text with them equal
// generate()'s with them, for every drafter.
TEST(TinyModels, WithAllowedTokenIdsAndBadWordsGreedyAndCoupledOutputEqualTargetOnlyOutput) {
  TinyPair m;
  const std::vector<int32_t> plain = target_only_text(m, SamplingParams{0.0f, 0, 1.0f, 0}), listed = target_only_text(m, lists_mode(0.0f));
  EXPECT_NE(plain, listed) << "the lists changed nothing: the test below would prove nothing";
  for (size_t i = 0; i < listed.size(); ++i) {
    EXPECT_TRUE(listed[i] != 7 && listed[i] != 11 && listed[i] != 5) << i;
    if (i > 0) EXPECT_NE(listed[i], listed[i - 1]) << i;
  }
  expect_same_as_generate(lists_mode(0.0f), SpecSampling::Exact, 4);
  expect_same_as_generate(lists_mode(0.8f, 0.95f), SpecSampling::Coupled, 4);
}

// Lists that leave no token after a few (tokens 1 and 2 only, no token twice in a row, and no 2
// after 1: "1" or "2 1" and then nothing): speculation stops at the same point, with the same
// tokens out before it, as target-only sampling, for every drafter, greedy and coupled.
TEST(TinyModels, WhereTheListsLeaveNoTokenSpeculationStopsWhereTargetOnlySamplingStops) {
  TinyPair m;
  ModelDrafter unrelated(m.draft, 256), itself(m.target, 256);
  NgramDrafter ngram(kVocab, 2);
  const std::unique_ptr<Drafter> eagle = eagle_drafter(m);
  SamplingParams dead_end{0.0f, 0, 1.0f, 0};
  dead_end.allowed_token_ids = {1, 2};
  dead_end.bad_words = {{1, 1}, {2, 2}, {1, 2}};
  int twos = 0;
  for (const float temperature : {0.0f, 0.9f})
    for (Drafter* drafter : std::initializer_list<Drafter*>{&unrelated, &itself, &ngram, eagle.get()})
      for (uint64_t seed = 0; seed < (temperature == 0.0f ? 1u : 20u); ++seed) {
        GenerateRequest g;
        g.prompt = {3, 9, 1, 3, 9};
        g.max_tokens = 20;
        g.sampling = dead_end;
        g.sampling.temperature = temperature;
        g.sampling.seed = seed;
        SpeculativeRequest s;
        static_cast<GenerateRequest&>(s) = g;
        s.draft.k = 3;
        s.mode = SpecSampling::Coupled;
        std::vector<int32_t> want, got;
        m.kv.truncate_to(m.seq, 0);
        EXPECT_THROW(generate(m.target, m.kv, m.seq, g, [&](int32_t t) { want.push_back(t); return true; }), std::runtime_error);
        m.kv.truncate_to(m.seq, 0);
        drafter->rollback(0);
        EXPECT_THROW(speculative_generate(m.target, m.kv, m.seq, *drafter, s, [&](int32_t t, TokenOrigin) {
                       got.push_back(t);
                       return true;
                     }),
                     std::runtime_error);
        ASSERT_EQ(got, want) << drafter->name() << ", T " << temperature << ", seed " << seed;
        ASSERT_TRUE(want == std::vector<int32_t>{1} || want == (std::vector<int32_t>{2, 1})) << want.size();
        twos += want.size() == 2;
      }
  EXPECT_GT(twos, 0) << "every run took the one-token path: the two-token dead end went untried";
}

// The drafters apply the penalties to their own rows (DraftPenalties), so the target drafting for
// itself proposes the adjusted target's tokens: with penalties (and with allowed_token_ids and
// bad_words, whose masks the drafts follow too), greedy and coupled, every draft is accepted, as
// without them. Without that, its raw argmax is rejected wherever the penalties
// move the target's.
TEST(TinyModels, WithPenaltiesTheTargetDraftingForItselfHasEveryDraftAccepted) {
  TinyPair m;
  ModelDrafter itself(m.target, 256);
  for (const SamplingParams& sp : {SamplingParams{0.0f, 0, 1.0f, 0, 0.0f, 0.4f, 0.3f, 1.2f, {{4, 1.0f}}},
                                   SamplingParams{0.8f, 0, 0.95f, 0, 0.0f, 0.8f, 0.6f, 1.5f, {}}, lists_mode(0.0f),
                                   lists_mode(0.8f, 0.95f)}) {
    SpeculativeRequest s;
    s.prompt = {3, 9, 1, 3, 9};
    s.max_tokens = 40;
    s.sampling = sp;
    s.draft.k = 4;
    s.mode = SpecSampling::Coupled;
    int64_t drafted = 0, accepted = 0;
    for (uint64_t seed = 0; seed < 10; ++seed) {
      s.sampling.seed = seed;
      m.kv.truncate_to(m.seq, 0);
      const SpeculativeStats st = speculative_generate(m.target, m.kv, m.seq, itself, s, [](int32_t, TokenOrigin) { return true; });
      drafted += st.drafted;
      accepted += st.accepted;
    }
    EXPECT_GT(drafted, 100);
    EXPECT_EQ(accepted, drafted) << "T " << sp.temperature;
  }
}

TEST(TinyModels, CoupledOutputEqualsTargetOnlySamplingForEverySeed) {
  expect_same_as_generate(SamplingParams{0.8f, 0, 0.95f, 0}, SpecSampling::Coupled, 4);
  expect_same_as_generate(SamplingParams{1.3f, 5, 1.0f, 0}, SpecSampling::Coupled, 2);
  expect_same_as_generate(SamplingParams{1.2f, 0, 1.0f, 0, 0.1f}, SpecSampling::Coupled, 3);
}

// The head's cache across rounds: what the drafter proposes after many rounds of rollback (its
// depth-1 entries kept, the speculative ones dropped, the accepted positions re-fed with the
// target's rows) is what a fresh drafter proposes when fed the whole context at once.
class CheckedEagle final : public Drafter {
 public:
  explicit CheckedEagle(TinyPair& m, MakeDrafter make = eagle_drafter) : m_(m), make_(std::move(make)), used_(make_(m)) {}
  std::string name() const override { return "checked-eagle"; }
  bool wants_target_hidden() const override { return true; }
  void target_hidden(int64_t first, std::span<const float> rows) override {
    used_->target_hidden(first, rows);
    h_.resize(static_cast<size_t>(first * 32));
    h_.insert(h_.end(), rows.begin(), rows.end());
  }
  void prefill(std::span<const int32_t> c) override { used_->prefill(c); h_.clear(); }
  void rollback(int64_t n) override {
    used_->rollback(n);
    if (static_cast<int64_t>(h_.size()) > n * 32) h_.resize(static_cast<size_t>(n * 32));
  }
  void propose(const DraftRequest& req, DraftProposal& out) override {
    used_->propose(req, out);
    const std::unique_ptr<Drafter> fresh = make_(m_);
    fresh->prefill(req.context);
    fresh->target_hidden(0, h_);
    DraftProposal want;
    fresh->propose(req, want);
    ++rounds;
    if (out.k() > 0) ++drafting_rounds;
    ASSERT_EQ(out.tokens, want.tokens) << "round " << rounds;
    ASSERT_EQ(out.q.size(), want.q.size());
    for (size_t v = 0; v < out.q.size(); ++v) ASSERT_NEAR(out.q[v], want.q[v], 1e-5f) << "round " << rounds << " at " << v;
  }
  int64_t rounds = 0, drafting_rounds = 0;

 private:
  TinyPair& m_;
  MakeDrafter make_;
  std::unique_ptr<Drafter> used_;
  std::vector<float> h_;
};

void expect_cache_survives_rollback(const MakeDrafter& make) {
  TinyPair m;
  CheckedEagle drafter(m, make);
  SpeculativeRequest s;
  s.prompt = {3, 9, 1, 3, 9, 4};
  s.max_tokens = 120;
  s.sampling = SamplingParams{0.9f, 0, 1.0f, 11};
  s.draft.k = 4;
  int64_t accepted = 0;
  for (uint64_t seed = 0; seed < 3; ++seed) {
    s.sampling.seed = seed;
    m.kv.truncate_to(m.seq, 0);
    accepted += speculative_generate(m.target, m.kv, m.seq, drafter, s, [](int32_t, TokenOrigin) { return true; }).accepted;
  }
  EXPECT_GT(drafter.drafting_rounds, 60);
  EXPECT_GT(accepted, 0);
}

TEST(EagleDrafter, ItsCacheAfterManyRoundsOfRollbackDraftsWhatAFreshOneFedTheWholeContextDrafts) {
  expect_cache_survives_rollback(eagle_drafter);
}

TEST(EagleDrafter, ATwoLayerHeadsCacheAfterManyRoundsOfRollbackDraftsWhatAFreshOneDrafts) {
  expect_cache_survives_rollback(two_layer_eagle_drafter);
}

// Three draws of a head that saw part of a context (`got`) equal, up to rounding, those of a head
// shown only that part (`want`), and differ from a head that saw all of it (`all`).
void expect_drafts_as_shown_and_not_as_all(const DraftProposal& got, const DraftProposal& want, const DraftProposal& all,
                                           const char* if_same_as_all) {
  ASSERT_EQ(got.k(), 3);
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.q.size(), want.q.size());
  float differs_from_all = 0;
  for (size_t v = 0; v < got.q.size(); ++v) {
    EXPECT_NEAR(got.q[v], want.q[v], 1e-4f) << v;
    differs_from_all = std::max(differs_from_all, std::abs(got.q[v] - all.q[v]));
  }
  EXPECT_GT(differs_from_all, 1e-3f) << if_same_as_all;
}

// The catch-up window: a head whose first draft comes 39 positions into its context feeds only
// the last 8 entries, and drafts what a head shown only the context from the window's start
// drafts (the same entries at RoPE positions shifted by 31: equal up to rounding). Without the
// window the drafts differ, so the test sees the window. A rollback to before the window's start
// restarts the cache: the head then drafts what a fresh windowed head drafts, bit for bit.
TEST(EagleDrafter, ALongCatchUpFeedsOnlyItsWindowAndDraftsAsAHeadShownOnlyTheWindow) {
  TinyPair m;
  const auto weights = tiny_eagle_weights(m);
  constexpr int64_t kLen = 40, kWindow = 8, kLast = kLen - 1;  // entries 1..kLast; the window kLast-7..kLast
  std::vector<int32_t> context(kLen);
  for (int64_t i = 0; i < kLen; ++i) context[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + i / 3) % kVocab);
  std::vector<float> rows(static_cast<size_t>(kLast * 32));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = std::sin(0.37f * static_cast<float>(i)) + 0.2f * std::cos(0.011f * static_cast<float>(i));
  auto draft = [&](EagleDrafter& d, int64_t from, int64_t to) {  // context [from, to), its rows
    const std::vector<int32_t> c(context.begin() + from, context.begin() + to);
    d.prefill(c);
    d.target_hidden(0, std::span<const float>(rows).subspan(static_cast<size_t>(from * 32), static_cast<size_t>((to - 1 - from) * 32)));
    DraftRequest req;
    req.context = c;
    req.position = 100;  // the same noise for every head
    req.max_tokens = 3;
    req.sampling = SamplingParams{1.0f, 0, 1.0f, 9};
    DraftProposal out;
    d.propose(req, out);
    return out;
  };
  // No context tokens here: they come from the context's last tokens, which the window does not
  // cut, so a head shown only the window would see fewer of them.
  EagleDrafter windowed(weights, 256, kWindow, 0), shown_window(weights, 256, 0, 0), whole(weights, 256, 0, 0);
  const DraftProposal got = draft(windowed, 0, kLen);
  const DraftProposal want = draft(shown_window, kLast - kWindow, kLen);
  const DraftProposal all = draft(whole, 0, kLen);
  expect_drafts_as_shown_and_not_as_all(got, want, all, "the window changed nothing: it was not applied");

  // Back to 21 tokens (before the window's start at entry 32), then draft there.
  windowed.rollback(20);
  DraftRequest req;
  const std::vector<int32_t> short_context(context.begin(), context.begin() + 21);
  req.context = short_context;
  req.position = 100;
  req.max_tokens = 3;
  req.sampling = SamplingParams{1.0f, 0, 1.0f, 9};
  DraftProposal again, fresh_out;
  windowed.propose(req, again);
  EagleDrafter fresh(weights, 256, kWindow, 0);
  fresh_out = draft(fresh, 0, 21);
  EXPECT_EQ(again.tokens, fresh_out.tokens);
  EXPECT_EQ(again.q, fresh_out.q);
  EXPECT_THROW(EagleDrafter(weights, 256, -1), std::invalid_argument);
}

// The engine's prefix cache: a new context whose target rows start at position 24 (the K/V before
// it were shared, so the target never ran those positions) drafts what a head shown only the
// context from 24 drafts (equal up to rounding, as the window above), not what a head given every
// row drafts. A gap after rows that did come still leaves the later rows unused.
TEST(EagleDrafter, AContextWhoseFirstRowsNeverCameDraftsAsAHeadShownOnlyTheContextFromItsFirstRow) {
  TinyPair m;
  const auto weights = tiny_eagle_weights(m);
  constexpr int64_t kLen = 40, kFirst = 24, kLast = kLen - 1;
  std::vector<int32_t> context(kLen);
  for (int64_t i = 0; i < kLen; ++i) context[static_cast<size_t>(i)] = static_cast<int32_t>((i * 5 + i / 4) % kVocab);
  std::vector<float> rows(static_cast<size_t>(kLast * 32));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = std::cos(0.29f * static_cast<float>(i)) + 0.3f * std::sin(0.017f * static_cast<float>(i));
  const auto row_span = [&](int64_t from, int64_t to) {
    return std::span<const float>(rows).subspan(static_cast<size_t>(from * 32), static_cast<size_t>((to - from) * 32));
  };
  auto propose = [&](EagleDrafter& d, const std::vector<int32_t>& c) {
    DraftRequest req;
    req.context = c;
    req.position = 100;
    req.max_tokens = 3;
    req.sampling = SamplingParams{1.0f, 0, 1.0f, 9};
    DraftProposal out;
    d.propose(req, out);
    return out;
  };
  EagleDrafter floored(weights, 256, 0, 0), shown(weights, 256, 0, 0), whole(weights, 256, 0, 0), gap(weights, 256, 0, 0);
  floored.prefill(context);
  floored.target_hidden(kFirst, row_span(kFirst, kLast));
  const DraftProposal got = propose(floored, context);
  const std::vector<int32_t> tail(context.begin() + kFirst, context.end());
  shown.prefill(tail);
  shown.target_hidden(0, row_span(kFirst, kLast));
  const DraftProposal want = propose(shown, tail);
  whole.prefill(context);
  whole.target_hidden(0, row_span(0, kLast));
  const DraftProposal all = propose(whole, context);
  expect_drafts_as_shown_and_not_as_all(got, want, all, "the missing rows changed nothing");
  // Rows 0..9, then rows from 20: the second batch is not used, so there is nothing to draft from.
  gap.prefill(context);
  gap.target_hidden(0, row_span(0, 10));
  gap.target_hidden(20, row_span(20, kLast));
  EXPECT_EQ(propose(gap, context).k(), 0);
}

// Context tokens: the random head's map lacks tokens 1, 4, 8 and 13. Of those, the ones in the
// context (4 and 13) get draft probability, the others none; the map's tokens keep their
// logits (their q ratios are those of a head without context tokens, scaled down by the mass
// the context tokens took); a cap of 1 keeps the newest; 0 turns them off; q sums to 1.
TEST(EagleDrafter, ProposesTheContextsTokensOutsideItsMapBesideItsOwn) {
  TinyPair m;
  const auto weights = tiny_eagle_weights(m);
  const std::vector<int32_t> context = {3, 9, 4, 2, 13, 5, 6, 7, 2};
  std::vector<float> rows(static_cast<size_t>((context.size() - 1) * 32));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = std::sin(0.29f * static_cast<float>(i)) + 0.3f * std::cos(0.013f * static_cast<float>(i));
  auto q_row = [&](int64_t context_tokens) {
    EagleDrafter d(weights, 256, 0, context_tokens);
    d.prefill(context);
    d.target_hidden(0, rows);
    const DraftProposal out = test::propose_one(d, context, 3);
    EXPECT_EQ(out.k(), 1);
    return std::vector<float>(out.q.begin(), out.q.begin() + kVocab);
  };
  const std::vector<float> none = q_row(0), both = q_row(32), newest = q_row(1);
  double sum = 0;
  for (float q : both) sum += q;
  EXPECT_NEAR(sum, 1.0, 1e-5);
  for (int32_t t : {1, 4, 8, 13}) EXPECT_EQ(none[static_cast<size_t>(t)], 0.0f) << t;
  EXPECT_GT(both[4], 0.0f);
  EXPECT_GT(both[13], 0.0f);
  EXPECT_EQ(both[1], 0.0f);
  EXPECT_EQ(both[8], 0.0f);
  EXPECT_EQ(newest[4], 0.0f);
  EXPECT_GT(newest[13], 0.0f);
  const double kept = 1.0 - both[4] - both[13];
  for (int32_t t : {0, 2, 3, 5, 6, 7, 9, 10, 11, 12, 14, 15})
    EXPECT_NEAR(both[static_cast<size_t>(t)], none[static_cast<size_t>(t)] * kept, 1e-5) << t;
  EXPECT_THROW(EagleDrafter(weights, 256, 0, -1), std::invalid_argument);
  EXPECT_THROW(EagleDrafter(weights, 256, 0, kEagleMaxContextTokens + 1), std::invalid_argument);
}

// Greedy drafting works on the head's N logits and its context tokens' (every other token is
// -inf), the context tokens' raised by kEagleContextBias: its token is the argmax of that row, and
// the entropy and confidence rules judge that row's softmax. The sampled path's q (temperature 1)
// is the softmax without the bias, so the greedy figures are q with the context tokens' entries
// times e^bias, renormalised. Without context tokens that is q itself; the context {3, 9, 1, 4}
// holds two of the tokens the tiny head lacks (1 and 4).
TEST(EagleDrafter, GreedyTokensAreTheRowsArgmaxAndTheEntropyAndConfidenceRulesJudgeItsSoftmax) {
  TinyPair m;
  const auto weights = tiny_eagle_weights(m);
  const std::vector<int32_t> context{3, 9, 1, 4};
  std::vector<float> rows(3 * 32);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = std::sin(0.37f * static_cast<float>(i));
  for (const int64_t context_tokens : {int64_t{0}, kEagleContextTokens}) {
    SCOPED_TRACE("context tokens " + std::to_string(context_tokens));
    auto drafter = [&] {
      auto d = std::make_unique<EagleDrafter>(weights, 256, 0, context_tokens);
      d->prefill(context);
      d->target_hidden(0, rows);
      return d;
    };
    DraftRequest req;
    req.context = context;
    req.max_tokens = 1;
    req.sampling = SamplingParams{1.0f, 0, 1.0f, 5};
    DraftProposal sampled;
    drafter()->propose(req, sampled);
    ASSERT_EQ(sampled.k(), 1);
    std::vector<float> q(sampled.q.begin(), sampled.q.begin() + kVocab);
    if (context_tokens > 0) {
      EXPECT_GT(q[1], 0.0f);
      EXPECT_GT(q[4], 0.0f);
      double z = 0;
      for (int32_t t : {1, 4}) q[static_cast<size_t>(t)] *= std::exp(kEagleContextBias);
      for (float x : q) z += x;
      for (float& x : q) x = static_cast<float>(x / z);
    }
    const auto want = static_cast<int32_t>(std::max_element(q.begin(), q.end()) - q.begin());
    const double h = entropy_nats(q);
    ASSERT_GT(h, 0.01);

    req.sampling = SamplingParams{0.0f, 0, 1.0f, 0};
    req.min_tokens = 0;
    DraftProposal greedy;
    drafter()->propose(req, greedy);
    ASSERT_EQ(greedy.k(), 1);
    EXPECT_EQ(greedy.tokens[0], want);
    EXPECT_TRUE(greedy.q.empty()) << "a greedy proposal carries no q rows";
    req.max_entropy = static_cast<float>(h + 1e-3);
    drafter()->propose(req, greedy);
    EXPECT_EQ(greedy.k(), 1) << "entropy " << h << " is under the threshold";
    req.max_entropy = static_cast<float>(h - 1e-3);
    drafter()->propose(req, greedy);
    EXPECT_EQ(greedy.k(), 0) << "entropy " << h << " is over the threshold";

    // The confidence rule judges the same softmax's top probability (greedy), and q of the drawn
    // token (sampled): the second token is drafted only if the first's probability reaches it.
    req.max_entropy = 0;
    req.max_tokens = 2;
    const struct {
      SamplingParams sampling;
      double prob;  // of the first draft token
    } cases[] = {{SamplingParams{0.0f, 0, 1.0f, 0}, q[static_cast<size_t>(want)]},
                 {SamplingParams{1.0f, 0, 1.0f, 5}, sampled.q[static_cast<size_t>(sampled.tokens[0])]}};
    for (const auto& c : cases) {
      SCOPED_TRACE(c.sampling.greedy() ? "greedy" : "sampled");
      req.sampling = c.sampling;
      DraftProposal out;
      req.min_confidence = static_cast<float>(c.prob * 0.999);
      drafter()->propose(req, out);
      EXPECT_EQ(out.k(), 2) << "probability " << c.prob << " is over the threshold";
      req.min_confidence = static_cast<float>(c.prob * 1.001);
      drafter()->propose(req, out);
      EXPECT_EQ(out.k(), 1) << "probability " << c.prob << " is under the threshold";
    }
  }
}

TEST(EagleDrafter, WithoutTheTargetsRowsItProposesNothing) {
  TinyPair m;
  const std::unique_ptr<Drafter> d = eagle_drafter(m);
  const std::vector<int32_t> context{3, 9, 1};
  d->prefill(context);
  DraftRequest req;
  req.context = context;
  req.max_tokens = 4;
  req.sampling = SamplingParams{1.0f, 0, 1.0f, 1};
  DraftProposal out;
  d->propose(req, out);
  EXPECT_EQ(out.k(), 0);
  std::vector<float> rows(2 * 32, 0.5f);
  d->target_hidden(0, rows);  // h_0, h_1: enough for entries 1 and 2
  d->propose(req, out);
  EXPECT_EQ(out.k(), 4);
}

}  // namespace
}  // namespace specula
