// Drafters and draft length: prompt lookup proposes the right continuation with one-hot q; a
// draft model with another vocabulary, a skip set that skips every layer and K outside 1..16
// are refused with clear errors; adaptive K follows acceptance; the entropy rule cuts drafts.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "gpu/host/host_device.h"
#include "model/gguf.h"
#include "model/pretokenizer.h"
#include "spec/adaptive_k.h"
#include "spec/grammar.h"
#include "spec/lookup_first_drafter.h"
#include "spec/make_drafter.h"
#include "spec/model_drafter.h"
#include "spec/ngram_drafter.h"
#include "spec/speculative_generate.h"
#include "tests/unit/spec/tiny_llama.h"
#include "tests/unit/tokenizer/tokenizer_test_support.h"

namespace specula {
namespace {

DraftRequest request(const std::vector<int32_t>& context, int k) {
  DraftRequest r;
  r.context = context;
  r.position = static_cast<int64_t>(context.size());
  r.max_tokens = k;
  r.sampling = SamplingParams{1.0f, 0, 1.0f, 7};
  return r;
}

// --- n-gram -----------------------------------------------------------------------------

TEST(NgramDrafter, ProposesWhatFollowedTheMostRecentLongestMatch) {
  NgramDrafter d(100, 3);
  //                                 match of [7 8 9] ---v          v--- suffix
  const std::vector<int32_t> ctx = {1, 7, 8, 9, 40, 41, 5, 7, 8, 9, 50, 51, 52, 7, 8, 9};
  DraftProposal out;
  d.propose(request(ctx, 3), out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{50, 51, 52}));  // the most recent occurrence wins
  ASSERT_EQ(out.q.size(), 300u);
  for (int i = 0; i < 3; ++i)
    for (int v = 0; v < 100; ++v) EXPECT_EQ(out.q[i * 100 + v], v == out.tokens[i] ? 1.0f : 0.0f);
}

// Under a grammar the verifier masks each row after the drafts before it, so a proposal token the
// grammar refuses is never accepted: the proposal ends before it, and goes on where it keeps it.
TEST(NgramDrafter, UnderAGrammarTheProposalEndsWhereTheGrammarWouldRefuseIt) {
  std::vector<std::string> texts;
  for (int v = 0; v < 100; ++v) texts.push_back(std::string(1, 't').append(std::to_string(v)).append(1, ' '));
  const auto trie = std::make_shared<const TokenTrie>(texts);
  const std::vector<int32_t> ctx = {1, 7, 8, 9, 50, 51, 52, 53, 7, 8, 9};
  auto proposal = [&](const std::string& gbnf) {
    NgramDrafter d(100, 3);
    DraftRequest r = request(ctx, 4);
    r.prompt_tokens = 8;  // the output is 7 8 9
    if (!gbnf.empty()) r.sampling.grammar = std::make_shared<const GrammarMatcher>(Grammar::parse(gbnf), trie);
    DraftProposal out;
    d.propose(r, out);
    EXPECT_EQ(out.q.size(), out.tokens.size() * 100);
    return out.tokens;
  };
  EXPECT_EQ(proposal(""), (std::vector<int32_t>{50, 51, 52, 53}));
  EXPECT_EQ(proposal("root ::= (\"t7 \" | \"t8 \" | \"t9 \" | \"t50 \" | \"t51 \" | \"t53 \")*\n"), (std::vector<int32_t>{50, 51}));
  EXPECT_EQ(proposal("root ::= \"t7 t8 t9 t50 t51 t52 t53 \"\n"), (std::vector<int32_t>{50, 51, 52, 53}));
  EXPECT_TRUE(proposal("root ::= \"t7 t8 t9 \" (\"t1 \" | \"t2 \")*\n").empty());
}

TEST(NgramDrafter, WritesQRowsOnlyWhereTheVerdictReadsThemThatIsForExactSampling) {
  // Greedy and coupled rounds are judged by the tokens alone (DraftRequest::verdict_reads_q), so
  // their proposals carry no q rows; exact sampling's carry one one-hot row per token.
  NgramDrafter d(100, 3);
  const std::vector<int32_t> ctx = {1, 7, 8, 9, 40, 41, 5, 7, 8, 9};
  for (const auto& [sampling, mode, rows] : {std::tuple{SamplingParams{0.0f, 0, 1.0f, 0}, SpecSampling::Exact, false},
                                             std::tuple{SamplingParams{1.0f, 0, 1.0f, 7}, SpecSampling::Coupled, false},
                                             std::tuple{SamplingParams{1.0f, 0, 1.0f, 7}, SpecSampling::Exact, true}}) {
    DraftRequest r = request(ctx, 2);
    r.sampling = sampling;
    r.mode = mode;
    EXPECT_EQ(r.verdict_reads_q(), rows);
    DraftProposal out;
    d.propose(r, out);
    EXPECT_EQ(out.tokens, (std::vector<int32_t>{40, 41}));
    EXPECT_EQ(out.q.size(), rows ? 200u : 0u) << (sampling.greedy() ? "greedy" : mode == SpecSampling::Coupled ? "coupled" : "exact");
  }
}

TEST(NgramDrafter, FallsBackToShorterSuffixesAndProposesNothingWithoutAMatch) {
  NgramDrafter d(100, 3);
  DraftProposal out;
  d.propose(request({1, 2, 3, 4, 2, 9, 9, 3}, 2), out);  // only [3] recurs: 3 -> 4 2
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{4, 2}));
  d.propose(request({1, 2, 3, 4, 5}, 4), out);
  EXPECT_TRUE(out.tokens.empty());
  EXPECT_TRUE(out.q.empty());
}

TEST(NgramDrafter, ARepeatingSpanIsProposedInFullPastTheContextsEnd) {
  NgramDrafter d(10, 3);
  DraftProposal out;
  d.propose(request({1, 2, 1, 2, 1, 2}, 5), out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{1, 2, 1, 2, 1}));
}

TEST(NgramDrafter, RefusesAnNOutside1To16) {
  EXPECT_THROW(NgramDrafter(10, 0), std::invalid_argument);
  EXPECT_THROW(NgramDrafter(10, 17), std::invalid_argument);
}

TEST(NgramDrafter, WithAMinimumItProposesOnlyWhereThatManyTokensMatch) {
  const std::vector<int32_t> ctx = {1, 2, 3, 4, 2, 9, 9, 3};  // only [3] recurs
  DraftProposal out;
  NgramDrafter(100, 3, 2).propose(request(ctx, 2), out);
  EXPECT_TRUE(out.tokens.empty());
  NgramDrafter(100, 3, 1).propose(request(ctx, 2), out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{4, 2}));
  NgramDrafter(100, 3, 2).propose(request({5, 6, 7, 1, 6, 7}, 2), out);  // [6 7] recurs
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{1, 6}));
  test::expect_error<std::invalid_argument>([] { NgramDrafter(10, 3, 4); }, {"min", "between 1 and n = 3", "got 4"});
  test::expect_error<std::invalid_argument>([] { NgramDrafter(10, 3, 0); }, {"min", "got 0"});
}

// --- vocabulary check -----------------------------------------------------------------

struct Vocab {
  std::vector<std::string> extra = {"<s>", "</s>", "ab", "cd", "xy"};
  std::vector<int32_t> types = {};  // default: byte tokens normal, <s> </s> control
  uint32_t bos = 256, eos = 257;
};

std::shared_ptr<const Tokenizer> tokenizer(const Vocab& v, const std::string& file) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_level::char_of_byte(static_cast<uint8_t>(b)));
  tokens.insert(tokens.end(), v.extra.begin(), v.extra.end());
  std::vector<int32_t> types = v.types;
  if (types.empty()) {
    types.assign(tokens.size(), 1);
    types[256] = types[257] = 3;
  }
  test::VocabGgufWriter w;
  w.set("tokenizer.ggml.model", std::string("gpt2"));
  w.set("tokenizer.ggml.pre", std::string("gpt-2"));
  w.set("tokenizer.ggml.tokens", tokens);
  w.set("tokenizer.ggml.token_type", types);
  w.set("tokenizer.ggml.merges", std::vector<std::string>{"a b", "c d"});
  w.set("tokenizer.ggml.bos_token_id", v.bos);
  w.set("tokenizer.ggml.eos_token_id", v.eos);
  const auto path = test::scratch_dir() / file;
  w.write(path);
  return Tokenizer::from_gguf(GgufFile(path.string()));
}

std::shared_ptr<LoadedModel> loaded(const Vocab& v, const std::string& name, int64_t logits = 16) {
  auto m = std::make_shared<LoadedModel>();
  m->path = name;
  m->format = "test";
  m->weights = test::tiny_llama(3, {.vocab = logits, .layers = 1});
  m->tokenizer = tokenizer(v, name + ".gguf");
  return m;
}

void expect_mismatch(const Vocab& draft, std::initializer_list<std::string> parts, int64_t logits = 16) {
  HostOps ops(1);
  const auto t = loaded(Vocab{}, "target"), d = loaded(draft, "draft", logits);
  test::expect_error<VocabularyMismatch>([&] { ModelDrafter(*t, d, ops, 64); }, parts);
}

TEST(ModelDrafter, AcceptsADraftWithTheSameVocabulary) {
  HostOps ops(1);
  const auto t = loaded(Vocab{}, "target"), d = loaded(Vocab{}, "draft");
  EXPECT_NO_THROW(ModelDrafter(*t, d, ops, 64));
}

TEST(ModelDrafter, RefusesADraftVocabularyThatDiffersAndNamesTheFirstDifference) {
  expect_mismatch(Vocab{.extra = {"<s>", "</s>", "ab", "cd", "yx"}}, {"draft", "token 260", "\"yx\"", "\"xy\""});
  expect_mismatch(Vocab{.extra = {"<s>", "</s>", "ab", "cd", "xy", "ef"}}, {"262 tokens", "261"});
  expect_mismatch(Vocab{}, {"32 logits", "16"}, 32);
  expect_mismatch(Vocab{.bos = 258}, {"BOS", "258", "256"});
  expect_mismatch(Vocab{.eos = 259}, {"EOS", "[259]", "[257]"});
  std::vector<int32_t> types(261, 1);
  types[256] = 3;  // </s> not special in the draft
  expect_mismatch(Vocab{.types = types}, {"token 257", "special in the target only"});
}

// --- one draft model for many sequences ---------------------------------------------------

// The engine resolves a drafter spelling once (DrafterFactory) and gives each request a drafter
// of its own over one copy of the draft weights; those drafters must not share anything else.
TEST(DrafterFactory, DraftersOverOneDraftModelKeepSeparateCachesAndProposeWhatLoneDraftersPropose) {
  HostOps ops(1);
  const auto t = loaded(Vocab{}, "target");
  auto d = loaded(Vocab{}, "draft");
  d->weights = test::tiny_llama(11, {.vocab = 16, .layers = 2});
  LlamaModel target(t->weights, ops);
  DrafterFactory factory(d, *t, target);
  EXPECT_EQ(factory.spelling(), "draft");
  std::unique_ptr<Drafter> a = factory.make(64), b = factory.make(64);
  ModelDrafter lone_a(*t, d, ops, 64), lone_b(*t, d, ops, 64);
  const std::vector<int32_t> ctx_a = {1, 2, 3, 4, 5}, ctx_b = {9, 8, 7};
  DraftProposal pa, pb, la, lb;
  for (int round = 0; round < 3; ++round) {  // interleaved, so a shared cache would show
    a->propose(request(ctx_a, 4), pa);
    b->propose(request(ctx_b, 3), pb);
    lone_a.propose(request(ctx_a, 4), la);
    lone_b.propose(request(ctx_b, 3), lb);
    EXPECT_EQ(pa.tokens, la.tokens) << "round " << round;
    EXPECT_EQ(pa.q, la.q) << "round " << round;
    EXPECT_EQ(pb.tokens, lb.tokens) << "round " << round;
    EXPECT_EQ(pb.q, lb.q) << "round " << round;
    a->rollback(static_cast<int64_t>(ctx_a.size()) - 1);
    b->rollback(static_cast<int64_t>(ctx_b.size()) - 1);
    lone_a.rollback(static_cast<int64_t>(ctx_a.size()) - 1);
    lone_b.rollback(static_cast<int64_t>(ctx_b.size()) - 1);
  }
  EXPECT_NE(pa.tokens, pb.tokens);  // the two contexts do lead to different drafts
}

TEST(DrafterFactory, RefusesADraftModelWithAnotherVocabularyOnceAtConstruction) {
  HostOps ops(1);
  const auto t = loaded(Vocab{}, "target"), d = loaded(Vocab{.bos = 258}, "draft");
  LlamaModel target(t->weights, ops);
  test::expect_error<VocabularyMismatch>([&] { DrafterFactory(d, *t, target); }, {"BOS", "258"});
}

TEST(DrafterFactory, RefusesBadSpellingsAtConstruction) {
  HostOps ops(1);
  const auto t = loaded(Vocab{}, "target");
  LlamaModel target(t->weights, ops);
  test::expect_error<std::invalid_argument>([&] { DrafterFactory("ngram:n=40", *t, target); }, {"between 1 and 16"});
  test::expect_error<std::invalid_argument>([&] { DrafterFactory("skip:0", *t, target); }, {"every one"});
  test::expect_error<std::invalid_argument>([&] { DrafterFactory("/no/such/draft.gguf", *t, target); },
                                            {"draft model not found", "/no/such/draft.gguf"});
  EXPECT_EQ(DrafterFactory("none", *t, target).make(64), nullptr);
  EXPECT_EQ(DrafterFactory("ngram:n=2", *t, target).make(64)->name(), "ngram:n=2");
  EXPECT_EQ(DrafterFactory("ngram:n=4,min=2", *t, target).make(64)->name(), "ngram:n=4,min=2");
  // Prompt lookup in front of another drafter: it must be followed by exactly one drafter that is
  // not prompt lookup, and its n and min are checked as alone.
  auto refused = [&](const std::string& spec, std::initializer_list<std::string> words) {
    SCOPED_TRACE(spec);
    test::expect_error<std::invalid_argument>([&] { DrafterFactory(spec, *t, target); }, words);
  };
  refused("ngram:n=3+", {"ngram:n=3+", "in front of one other drafter"});
  refused("ngram:n=3+none", {"in front of one other drafter"});
  refused("ngram:n=3+ngram:n=2", {"in front of one other drafter", "ngram:n=3+eagle"});
  refused("ngram:n=3,min=4+skip:0", {"min", "got 4"});
  refused("ngram:n=3,max=2+skip:0", {"ngram:n=3,max=2+skip:0", "ngram:n=N,min=M"});
  refused("ngram:n=x+skip:0", {"ngram:n=x+skip:0"});
  refused("ngram:n=3+skip:0", {"every one"});
  refused("ngram:n=3+/no/such/draft.gguf", {"draft model not found", "/no/such/draft.gguf"});
  // The head's context tokens: ",context=N" with N in 0..1024, checked before any file is read.
  refused("eagle,context=x", {"eagle,context=x", "eagle[:PATH][,context=N]", "0..1024"});
  refused("eagle,context=1025", {"0..1024"});
  refused("eagle,context=-1", {"0..1024"});
  refused("eagle,ctx=3", {"eagle,ctx=3", "eagle[:PATH][,context=N]"});
  refused("ngram:n=3+eagle:/no/such/head.gguf,context=8", {"draft head not found", "/no/such/head.gguf"});
}

// --- prompt lookup in front of another drafter ------------------------------------------

// `ngram:n=N+OTHER`: a round is prompt lookup's where the context's last N tokens occur earlier
// (min= lowers N), and the other drafter's otherwise; that drafter's cache stays in step either way.
TEST(LookupFirstDrafter, DraftsByLookupWhereTheFullNGramRecursAndByTheOtherDrafterElsewhere) {
  HostOps ops(1);
  const auto t = loaded(Vocab{}, "target");
  t->weights = test::tiny_llama(11, {.vocab = 16, .layers = 2});
  LlamaModel target(t->weights, ops);
  DrafterFactory factory("ngram:n=2+skip:1", *t, target);
  EXPECT_EQ(factory.spelling(), "ngram:n=2+skip:1");
  std::unique_ptr<Drafter> d = factory.make(64);
  ModelDrafter skip(target, 64, {false, true});
  EXPECT_EQ(d->name(), "ngram:n=2,min=2+skip:1");
  auto* both = dynamic_cast<LookupFirstDrafter*>(d.get());
  ASSERT_NE(both, nullptr);

  DraftProposal got, want;
  const std::vector<int32_t> repeats = {4, 5, 6, 9, 4, 5};  // [4 5] recurs: lookup drafts 6 9 4
  d->propose(request(repeats, 3), got);
  EXPECT_EQ(got.tokens, (std::vector<int32_t>{6, 9, 4}));
  EXPECT_EQ(both->lookup_rounds(), 1);
  d->rollback(6);
  // Only [5] recurs: below the 2-token minimum, so the skip drafter drafts, as it would alone.
  const std::vector<int32_t> once = {4, 5, 6, 9, 4, 5, 7, 5};
  d->propose(request(once, 3), got);
  skip.propose(request(once, 3), want);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.q, want.q);
  EXPECT_EQ(both->other_rounds(), 1);
  // A context whose draft the other drafter's cache has to catch up to after rollback.
  d->rollback(3);
  skip.rollback(3);
  const std::vector<int32_t> fresh = {4, 5, 6, 12, 13, 14};
  d->propose(request(fresh, 2), got);
  skip.propose(request(fresh, 2), want);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.q, want.q);
  EXPECT_EQ(both->lookup_rounds(), 1);
  EXPECT_EQ(both->other_rounds(), 2);
  EXPECT_THROW(LookupFirstDrafter(NgramDrafter(16, 2), nullptr), std::invalid_argument);
}

// --- skip sets ------------------------------------------------------------------------

TEST(SkipLayers, ParsesRangesAndLists) {
  const auto s = parse_skip_layers("1,3-5,9", 10);
  EXPECT_EQ(s, (std::vector<bool>{false, true, false, true, true, true, false, false, false, true}));
}

TEST(SkipLayers, RefusesASetThatSkipsEveryLayer) {
  test::expect_error<std::invalid_argument>([] { parse_skip_layers("0-29", 30); }, {"every", "30 layers"});
  test::expect_error<std::invalid_argument>([] { parse_skip_layers("0,1", 2); }, {"every", "2 layers"});
  HostOps ops(1);
  const ModelWeights w = test::tiny_llama(4, {.layers = 2});
  LlamaModel model(w, ops);
  test::expect_error<std::invalid_argument>([&] { ModelDrafter(model, 64, {true, true}); }, {"every", "2 layers"});
  test::expect_error<std::invalid_argument>([&] { ModelDrafter(model, 64, {true}); }, {"1 flags", "2 layers"});
}

TEST(SkipLayers, RefusesBadSyntaxAndLayersOutsideTheModel) {
  test::expect_error<std::invalid_argument>([] { parse_skip_layers("3-x", 30); }, {"'x'", "not a layer number"});
  test::expect_error<std::invalid_argument>([] { parse_skip_layers("", 30); }, {"empty"});
  test::expect_error<std::invalid_argument>([] { parse_skip_layers("28-30", 30); }, {"layer 30", "0..29"});
  test::expect_error<std::invalid_argument>([] { parse_skip_layers("5-2", 30); }, {"5-2", "empty"});
}

// --- draft length ---------------------------------------------------------------------

TEST(DraftLength, RefusesKBelowOneOrAboveTheLimit) {
  test::expect_error<std::invalid_argument>([] { DraftLengthConfig{.k = 0}.validate(); }, {"K", "between 1 and 16", "got 0"});
  test::expect_error<std::invalid_argument>([] { DraftLengthConfig{.k = 17}.validate(); }, {"got 17"});
  test::expect_error<std::invalid_argument>([] { DraftLengthConfig{.k = 4, .adaptive = true, .k_min = 6, .k_max = 5}.validate(); },
                                            {"K_min 6", "K_max 5"});
  test::expect_error<std::invalid_argument>([] { DraftLengthConfig{.k = 4, .adaptive = true, .k_min = 1, .k_max = 20}.validate(); },
                                            {"K_max", "got 20"});
  test::expect_error<std::invalid_argument>([] { DraftLengthConfig{.min_confidence = 1.0f}.validate(); },
                                            {"draft confidence", "[0, 1)", "got 1.0"});
  test::expect_error<std::invalid_argument>([] { DraftLengthConfig{.min_confidence = -0.1f}.validate(); },
                                            {"draft confidence", "got -0.1"});
  DraftLengthConfig{.min_confidence = 0.5f}.validate();
  test::expect_error<std::invalid_argument>([] { DraftLengthConfig{.min_confidence_greedy = 1.5f}.validate(); },
                                            {"greedy draft confidence", "[0, 1)", "got 1.5"});
}

TEST(DraftLength, RefusesAGreedyKMaxOutsideTheLimitOrBelowKMin) {
  test::expect_error<std::invalid_argument>([] { DraftLengthConfig{.k_max_greedy = 17}.validate(); },
                                            {"K_max for greedy requests", "between 1 and 16", "got 17"});
  test::expect_error<std::invalid_argument>([] { DraftLengthConfig{.k_max_greedy = -1}.validate(); }, {"got -1"});
  test::expect_error<std::invalid_argument>(
      [] { DraftLengthConfig{.k = 4, .adaptive = true, .k_min = 6, .k_max = 8, .k_max_greedy = 5}.validate(); },
      {"K_min 6", "K_max for greedy requests 5"});
  DraftLengthConfig{.k = 4, .adaptive = true, .k_min = 1, .k_max = 4, .k_max_greedy = 6}.validate();
}

TEST(DraftLengthConfig, AGreedyKMaxReplacesKMaxForGreedyRequestsOnly) {
  const DraftLengthConfig c{.k = 4, .adaptive = true, .k_max = 4, .k_max_greedy = 6, .min_confidence = 0.3f};
  EXPECT_EQ(c.resolved(true).k_max, 6);
  EXPECT_EQ(c.resolved(false).k_max, 4);
  EXPECT_EQ(c.resolved(true).k_max_greedy, 0) << "resolved once, the request carries one K_max";
  // With the confidence rule, adaptive K is K_max from the first round: a greedy request drafts
  // up to 6 tokens a round, a sampled one up to 4.
  EXPECT_EQ(DraftLength(c.resolved(true)).next(), 6);
  EXPECT_EQ(DraftLength(c.resolved(false)).next(), 4);
  const DraftLengthConfig none{.k = 4, .adaptive = true, .k_max = 4};  // no greedy K_max: both kinds use k_max
  EXPECT_EQ(none.resolved(true).k_max, 4);
}

TEST(DraftLengthConfig, AGreedyThresholdReplacesTheConfidenceRulesForGreedyRequestsOnly) {
  const DraftLengthConfig both{.k = 4, .min_confidence = 0.3f, .min_confidence_greedy = 0.5f};
  EXPECT_FLOAT_EQ(both.resolved(true).min_confidence, 0.5f);
  EXPECT_FLOAT_EQ(both.resolved(false).min_confidence, 0.3f);
  EXPECT_EQ(both.resolved(true).min_confidence_greedy, 0.0f) << "resolved once, the request carries one threshold";
  EXPECT_EQ(both.resolved(true).k, 4);
  const DraftLengthConfig one{.min_confidence = 0.3f};  // no greedy threshold: both kinds use the one
  EXPECT_FLOAT_EQ(one.resolved(true).min_confidence, 0.3f);
  const DraftLengthConfig greedy_only{.min_confidence_greedy = 0.5f};  // sampled requests draft without the rule
  EXPECT_FLOAT_EQ(greedy_only.resolved(true).min_confidence, 0.5f);
  EXPECT_EQ(greedy_only.resolved(false).min_confidence, 0.0f);
}

TEST(DraftLength, SpeculativeGenerateRefusesABadKBeforeRunningAnything) {
  HostOps ops(1);
  const ModelWeights w = test::tiny_llama(4, {.layers = 1});
  LlamaModel model(w, ops);
  KvCache kv(ops, model.kv_config(64));
  const int seq = kv.create_sequence();
  NgramDrafter d(16, 3);
  SpeculativeRequest req;
  req.prompt = {1, 2};
  req.draft.k = 0;
  EXPECT_THROW(speculative_generate(model, kv, seq, d, req, [](int32_t, TokenOrigin) { return true; }),
               std::invalid_argument);
  EXPECT_EQ(kv.length(seq), 0);
}

TEST(DraftLength, Theorem38MatchesThePapersFormula) {
  EXPECT_NEAR(expected_tokens_per_round(0.8, 4), (1 - std::pow(0.8, 5)) / 0.2, 1e-12);
  EXPECT_NEAR(expected_tokens_per_round(1.0, 4), 5, 1e-12);
  EXPECT_NEAR(theorem_3_8_speedup(0.8, 4, 0.1), (1 - std::pow(0.8, 5)) / (0.2 * 1.4), 1e-12);
  EXPECT_NEAR(theorem_3_8_speedup(0.0, 3, 0.5), 1 / 2.5, 1e-12);
}

TEST(DraftLength, FixedKNeverMoves) {
  DraftLength dl(DraftLengthConfig{.k = 5});
  for (int i = 0; i < 50; ++i) dl.observe(5, 0, 0.01, 0.02);
  EXPECT_EQ(dl.next(), 5);
}

TEST(DraftLength, AdaptiveKGrowsWhenDraftsAreAcceptedAndShrinksWhenTheyAreNot) {
  // A cheap draft (c = 0.05) and a verify that costs 1 + 0.05 per extra token.
  const DraftLengthConfig cfg{.k = 4, .adaptive = true, .k_min = 1, .k_max = 12};
  auto verify = [](int k) { return 0.010 * (1 + 0.05 * k); };
  DraftLength good(cfg), bad(cfg);
  for (int r = 0; r < 60; ++r) {
    const int kg = good.next(), kb = bad.next();
    good.observe(kg, kg, 0.0005 * kg, verify(kg));                 // everything accepted
    bad.observe(kb, r % 3 == 0 ? 1 : 0, 0.0005 * kb, verify(kb));  // a ~ 0.25
  }
  EXPECT_GE(good.next(), 10);
  EXPECT_LE(bad.next(), 2);
  EXPECT_GT(good.acceptance(), 0.95);
  EXPECT_LT(bad.acceptance(), 0.4);
}

TEST(DraftLength, WithTheConfidenceRuleAdaptiveKStaysAtItsCap) {
  const DraftLengthConfig cfg{.k = 2, .adaptive = true, .k_min = 1, .k_max = 6, .min_confidence = 0.3f};
  DraftLength dl(cfg);
  EXPECT_EQ(dl.next(), 6);
  for (int r = 0; r < 40; ++r) dl.observe(dl.next(), 0, 0.010 * dl.next(), 0.010);  // nothing accepted
  EXPECT_EQ(dl.next(), 6) << "the rule, not the running acceptance, sets the length";
  DraftLengthConfig plain = cfg;
  plain.min_confidence = 0;
  DraftLength control(plain);
  for (int r = 0; r < 40; ++r) control.observe(control.next(), 0, 0.010 * control.next(), 0.010);
  EXPECT_EQ(control.next(), 1) << "the control: without the rule, K follows acceptance down";
}

TEST(DraftLength, AnExpensiveDraftKeepsKShort) {
  const DraftLengthConfig cfg{.k = 8, .adaptive = true, .k_min = 1, .k_max = 16};
  DraftLength dl(cfg);
  for (int r = 0; r < 60; ++r) {
    const int k = dl.next();
    dl.observe(k, std::min(k, 2), 0.010 * k, 0.010);  // c = 1 and two tokens accepted per round
  }
  EXPECT_LE(dl.next(), 3);
}

// --- the automatic confidence threshold --------------------------------------------------

// Rounds that alternate one and two draft tokens with linear costs (a draft depth 0.1 ms, a
// verify row 0.5 ms), one token accepted each, the draft's products 0.8 then 0.4: R ~ 4 tokens /
// 8.2 ms, d1 + v1 = 0.6 ms, calibration r ~ (1 + 1) / (1 + 1.8) hits per unit of P_{i-1}.
void run_alternating_rounds(DraftLength& dl, int rounds, double verify_row = 0.0005, double hit_share = 1.0) {
  for (int r = 0; r < rounds; ++r) {
    const int k = 1 + r % 2;
    const std::vector<float> products = k == 1 ? std::vector<float>{0.8f} : std::vector<float>{0.8f, 0.4f};
    const int accepted = (r / 2) % 4 < static_cast<int>(4 * hit_share) ? 1 : 0;
    dl.observe(k, accepted, 0.0002 + 0.0001 * k, 0.003 + verify_row * k);
    dl.observe_confidence(products, k, accepted);
  }
}

TEST(DraftLength, TheAutomaticThresholdStartsWhereItWasToldThenPricesADraftTokenByWhatItCostsAndBrings) {
  const DraftLengthConfig cfg{.k = 4, .adaptive = true, .k_min = 1, .k_max = 4, .min_confidence = 0.3f, .confidence_auto = true};
  DraftLength dl(cfg);
  EXPECT_FLOAT_EQ(dl.confidence_threshold(), 0.3f) << "no measurements yet: the starting threshold";
  run_alternating_rounds(dl, cfg.confidence_warmup - 1);
  EXPECT_FLOAT_EQ(dl.confidence_threshold(), 0.3f) << "still warming up";
  run_alternating_rounds(dl, 80);
  // R (d1 + v1) / r from the rounds' figures (the forgetting weighs the two kinds of round a few
  // percent apart, hence the tolerance).
  const double rate = 4 / (0.0003 + 0.0035 + 0.0004 + 0.004), cost = 0.0001 + 0.0005, r = 2 / 2.8;
  EXPECT_NEAR(dl.confidence_threshold(), rate * cost / r, 0.05 * rate * cost / r);
  EXPECT_NEAR(dl.confidence_calibration(), r, 0.05 * r);
  // The engine's scheduler prices a token by the batch's rounds: its R and its cost of a row
  // replace the request's own (a batch of 2 whose row costs what one request's did: twice the rate).
  EXPECT_NEAR(dl.confidence_threshold(2 * rate, 0.0005), 2 * rate * cost / r, 0.1 * rate * cost / r);
  EXPECT_NEAR(dl.confidence_threshold(rate, 0.0), rate * 0.0001 / r, 0.05 * rate * 0.0001 / r);
  EXPECT_FLOAT_EQ(dl.confidence_threshold(0.0, 0.0005), 0.3f) << "no rate measured: the start";

  // Dearer verify rows, or drafts accepted less often than their products say: a higher
  // threshold (shorter drafts); rows that cost nothing: the floor; rows dearer than any draft
  // token can repay: the ceiling.
  DraftLength dear(cfg), doubted(cfg), free_rows(cfg), ruinous(cfg);
  run_alternating_rounds(dear, 88, 0.002);
  run_alternating_rounds(doubted, 88, 0.0005, 0.5);
  run_alternating_rounds(free_rows, 88, 0.0);
  run_alternating_rounds(ruinous, 88, 0.05);
  EXPECT_GT(dear.confidence_threshold(), dl.confidence_threshold() * 1.5);
  EXPECT_GT(doubted.confidence_threshold(), dl.confidence_threshold() * 1.3);
  EXPECT_LT(free_rows.confidence_threshold(), dl.confidence_threshold() / 3);
  EXPECT_FLOAT_EQ(ruinous.confidence_threshold(), static_cast<float>(kAutoConfidenceMax));

  // Off, or with a fixed K (the seed promise's exact mode), the threshold is the one given
  // whatever was measured.
  DraftLengthConfig fixed = cfg, fixed_k = cfg;
  fixed.confidence_auto = false;
  fixed_k.adaptive = false;
  DraftLength still(fixed), still_k(fixed_k);
  run_alternating_rounds(still, 88);
  run_alternating_rounds(still_k, 88);
  EXPECT_FLOAT_EQ(still.confidence_threshold(), 0.3f);
  EXPECT_FLOAT_EQ(still_k.confidence_threshold(), 0.3f);
}

TEST(DraftLength, TheCalibrationCountsOnlyProposalsThatCarryOneProductPerToken) {
  DraftLength dl(DraftLengthConfig{.min_confidence = 0.3f, .confidence_auto = true});
  dl.observe_confidence({}, 3, 0);                     // a drafter without the rule (prompt lookup)
  const std::vector<float> two{0.5f, 0.25f};
  dl.observe_confidence(two, 3, 0);                    // a row that is not the proposal's
  EXPECT_DOUBLE_EQ(dl.confidence_calibration(), 1.0);  // the prior alone
  dl.observe_confidence(two, 2, 0);                    // counted: P_0 = 1 and P_1 = 0.5, no hits
  EXPECT_LT(dl.confidence_calibration(), 0.5);
}

TEST(DraftLengthConfig, AutomaticConfidenceNeedsAThresholdToStartFromAndAWarmUpInRange) {
  test::expect_error<std::invalid_argument>([] { DraftLengthConfig{.confidence_auto = true}.validate(); },
                                            {"automatic draft confidence", "start from"});
  test::expect_error<std::invalid_argument>(
      [] { DraftLengthConfig{.min_confidence = 0.3f, .confidence_auto = true, .confidence_warmup = -1}.validate(); },
      {"warm-up", "0..1000", "got -1"});
  DraftLengthConfig{.min_confidence_greedy = 0.5f, .confidence_auto = true}.validate();
}

// --- the entropy rule -------------------------------------------------------------------

TEST(EntropyCutoff, AFlatDraftStopsAfterTheMinimumAndAPeakedOneRunsToK) {
  HostOps ops(1);
  const ModelWeights flat_w = test::tiny_llama(5, {.layers = 1, .logit_scale = 0.01f});  // q ~ uniform: H ~ log 16
  const ModelWeights peaked_w = test::tiny_llama(6, {.layers = 1, .logit_scale = 30.0f});
  LlamaModel flat(flat_w, ops), peaked(peaked_w, ops);
  ModelDrafter flat_d(flat, 64), peaked_d(peaked, 64);
  const std::vector<int32_t> context = {1, 2, 3};
  DraftRequest r = request(context, 6);
  r.max_entropy = 1.0f;
  r.min_tokens = 2;
  DraftProposal out;
  flat_d.propose(r, out);
  EXPECT_EQ(out.k(), 2);
  EXPECT_GT(entropy_nats({out.q.data(), 16}), 2.7);
  peaked_d.propose(r, out);
  EXPECT_EQ(out.k(), 6);
}

// --- the confidence rule ----------------------------------------------------------------

// The running products of the tokens' draft probabilities.
std::vector<double> running_products(const std::vector<double>& probs) {
  std::vector<double> p;
  double x = 1;
  for (double v : probs) p.push_back(x *= v);
  return p;
}

TEST(ConfidenceRule, ADraftStopsAfterTheTokenThatTakesTheProductOfItsProbabilitiesBelowTheThreshold) {
  HostOps ops(1);
  const ModelWeights w = test::tiny_llama(7, {.layers = 1, .logit_scale = 3.0f});
  LlamaModel model(w, ops);
  ModelDrafter d(model, 64);
  const std::vector<int32_t> context = {1, 2, 3};
  const int64_t vocab = w.config.vocab_size;
  for (const bool greedy : {false, true}) {
    SCOPED_TRACE(greedy ? "greedy" : "sampled");
    DraftRequest r = request(context, 6);
    if (greedy) r.sampling = SamplingParams{0.0f, 0, 1.0f, 0};
    DraftProposal all;
    d.propose(r, all);
    ASSERT_EQ(all.k(), 6);
    // Each token's draft probability: q's for sampled params; for greedy ones, the softmax at
    // temperature 1 of the same logits, which a sampled proposal of those tokens shows.
    std::vector<double> probs;
    if (!greedy) {
      for (int i = 0; i < 6; ++i) probs.push_back(all.q[static_cast<size_t>(i * vocab + all.tokens[static_cast<size_t>(i)])]);
    } else {
      // The greedy rule judges the untempered softmax: the largest entry of the temperature-1 q
      // row at each prefix of the greedy path (whose argmax is the greedy token).
      for (int i = 0; i < 6; ++i) {
        std::vector<int32_t> prefix = context;
        prefix.insert(prefix.end(), all.tokens.begin(), all.tokens.begin() + i);
        DraftRequest one = request(prefix, 1);
        DraftProposal row;
        d.propose(one, row);
        ASSERT_EQ(row.k(), 1);
        probs.push_back(*std::max_element(row.q.begin(), row.q.end()));
        EXPECT_EQ(std::max_element(row.q.begin(), row.q.end()) - row.q.begin(), all.tokens[static_cast<size_t>(i)]);
      }
    }
    const std::vector<double> products = running_products(probs);
    ASSERT_LT(products[5], products[1]) << "the tiny model must not be certain of every token";
    for (int keep = 1; keep < 6; ++keep) {
      if (products[static_cast<size_t>(keep)] == products[static_cast<size_t>(keep - 1)]) continue;
      // A threshold between the products after `keep` and `keep` + 1 tokens: the product after
      // `keep` + 1 tokens is the first below it, so the draft ends with that token.
      r.min_confidence = static_cast<float>(std::sqrt(products[static_cast<size_t>(keep - 1)] * products[static_cast<size_t>(keep)]));
      r.min_tokens = 1;
      DraftProposal cut;
      d.propose(r, cut);
      EXPECT_EQ(cut.k(), keep + 1) << "threshold " << r.min_confidence;
      EXPECT_TRUE(std::equal(cut.tokens.begin(), cut.tokens.end(), all.tokens.begin()));
      // The proposal carries the rule's running products, one per token (the automatic
      // threshold's calibration reads them).
      ASSERT_EQ(static_cast<int64_t>(cut.confidence.size()), cut.k());
      for (size_t i = 0; i < cut.confidence.size(); ++i) EXPECT_NEAR(cut.confidence[i], products[i], 1e-5 * products[i]);
      // Never below the minimum: with min_tokens above the cut, the draft runs to min_tokens.
      r.min_tokens = keep + 2;
      d.propose(r, cut);
      EXPECT_GE(cut.k(), std::min(keep + 2, 6));
    }
    // The first token is always drafted (nothing came before it), then the rule stops.
    r.min_confidence = static_cast<float>(probs[0] * 1.001);
    r.min_tokens = 0;
    d.propose(r, all);
    EXPECT_EQ(all.k(), 1);
  }
}

}  // namespace
}  // namespace specula
