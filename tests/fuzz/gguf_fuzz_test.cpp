// Mutational fuzzing of the GGUF loader under AddressSanitizer and UndefinedBehaviorSanitizer.
// A valid tiny GGUF Llama (tests/unit/model/tiny_gguf.h) is damaged thousands of times with fixed
// seeds (bytes overwritten, counts, lengths and offsets set to extreme values, spans cut out or
// repeated, the file cut short) and loaded with load_model. Every outcome must be either a
// loaded model whose tokenizer and chat template work, or a ModelError with a one-line message;
// never a crash, a sanitizer report (the test binary aborts on the first), another exception
// type, or an allocation sized by an unchecked count.
//
// The mutations aim at the header, the metadata and the tensor infos (everything before the
// tensor data): damaged weights are still weights. SPECULA_FUZZ_ITERATIONS sets the count
// (default 20,000, about 25 s in the sanitizer build; 150,000 ran clean once).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "model/weights.h"
#include "tiny_gguf.h"

namespace specula {
namespace {

using test::Bytes;

int iterations() {
  const char* e = std::getenv("SPECULA_FUZZ_ITERATIONS");
  return e && *e ? std::atoi(e) : 20000;
}

const uint64_t kInteresting[] = {0, 1, 2, 7, 0x7f, 0x80, 0xff, 0xffff, 0x7fffffff, 0x80000000, 0xffffffff,
                                 uint64_t{1} << 32, uint64_t{1} << 40, uint64_t{1} << 62, ~uint64_t{0},
                                 ~uint64_t{0} - 7};

struct Mutator {
  std::mt19937_64 rng;
  size_t head;  // bytes before the tensor data

  size_t pick(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); }
  // A random value, or more often one of kInteresting.
  uint64_t value(size_t random_one_in) {
    return pick(random_one_in) == 0 ? rng() : kInteresting[pick(std::size(kInteresting))];
  }
  // Overwrites `bytes` bytes at `at` (little-endian, as GGUF stores numbers), clipped to the file.
  static void put(Bytes& b, size_t at, uint64_t v, size_t bytes) {
    for (size_t i = 0; i < bytes && at + i < b.size(); ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
  }
  // A span of up to 64 bytes at a random place before the tensor data: [at, end).
  std::pair<std::ptrdiff_t, std::ptrdiff_t> span(const Bytes& b, size_t limit) {
    const size_t at = pick(limit), end = std::min(b.size(), at + 1 + pick(64));
    return {static_cast<std::ptrdiff_t>(at), static_cast<std::ptrdiff_t>(end)};
  }

  void mutate(Bytes& b) {
    const int ops = 1 + static_cast<int>(pick(4));
    for (int k = 0; k < ops && !b.empty(); ++k) {
      const size_t limit = std::min(head, b.size());
      switch (pick(6)) {
        case 0: b[pick(limit)] = static_cast<uint8_t>(rng()); break;  // one byte
        case 1: {  // a u64 field, aligned or not (sequenced: argument order is unspecified)
          const size_t at = pick(limit);
          put(b, at, value(4), 8);
          break;
        }
        case 2: {  // a u32 field (types, counts)
          const size_t at = pick(limit);
          put(b, at, value(3), 4);
          break;
        }
        case 3: b.resize(pick(b.size())); break;                        // cut short
        case 4: {                                                       // cut a span out
          const auto [at, end] = span(b, limit);
          b.erase(b.begin() + at, b.begin() + end);
          break;
        }
        default: {  // repeat a span
          const auto [at, end] = span(b, limit);
          const Bytes copy(b.begin() + at, b.begin() + end);
          b.insert(b.begin() + at, copy.begin(), copy.end());
          break;
        }
      }
    }
  }
};

TEST(GgufFuzz, DamagedFilesLoadOrFailWithOneLineAndNeverCrash) {
  test::TempDir dir;
  test::GgufModel model;
  model.t.layers = 1;  // small file, fast iterations
  model.shapes = test::tiny_shapes(model.t, false);
  const Bytes valid = model.bytes();
  const std::string valid_path = model.write(dir, "valid.gguf");
  // The positive control: the undamaged file loads and its tokenizer round-trips.
  {
    LoadedModel m = load_model(valid_path);
    ASSERT_EQ(m.tokenizer->decode(m.tokenizer->encode("the theory")), "the theory");
  }
  // The tensor data starts with the first tensor the writer wrote (the maps are sorted by name):
  // find its bytes.
  const auto& [first_name, first_shape] = *model.shapes.begin();
  const Bytes first = test::as_bytes(test::values(test::numel(first_shape), test::name_seed(first_name)));
  const size_t head = static_cast<size_t>(std::search(valid.begin(), valid.end(), first.begin(), first.begin() + 64) - valid.begin());
  ASSERT_LT(head, valid.size());
  ASSERT_GT(head, 1000u) << "the metadata region should hold the vocabulary";

  Mutator mut{std::mt19937_64(20261122), head};
  int loaded = 0, refused = 0;
  const int n = iterations();
  for (int i = 0; i < n; ++i) {
    Bytes b = valid;
    mut.mutate(b);
    const std::string path = dir.file("m" + std::to_string(i % 8) + ".gguf");
    test::write_file(path, b);
    try {
      LoadedModel m = load_model(path);
      // What loaded must work: tokenize, detokenize, render the template.
      const std::vector<int32_t> ids = m.tokenizer->encode("the <|im_start|> theory \xe2\x82\xac");
      (void)m.tokenizer->decode(ids);
      try {  // a damaged template that parses renders, or fails this conversation as its request's error
        (void)m.chat_template.render({{"user", "hi"}});
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("the model's chat template"), std::string::npos) << "iteration " << i << ": " << e.what();
        EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "iteration " << i;
      }
      ++loaded;
    } catch (const ModelError& e) {
      const std::string what = e.what();
      EXPECT_FALSE(what.empty()) << "iteration " << i;
      EXPECT_EQ(what.find('\n'), std::string::npos) << "iteration " << i << ": " << what;
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << i << ": " << typeid(e).name() << " instead of a ModelError: " << e.what();
    }
  }
  RecordProperty("loaded", loaded);
  RecordProperty("refused", refused);
  std::printf("[ fuzz     ] %d damaged files: %d loaded, %d refused with a ModelError\n", n, loaded, refused);
  // The mutations must reach both outcomes, or they test nothing.
  EXPECT_GT(refused, n / 4);
  EXPECT_GT(loaded, 0);
}

// Run only by the ctest entry gguf_fuzz_catches_a_planted_overflow, which passes when the
// sanitizer reports this read: proof that the fuzz test above would see one in the loader.
TEST(SanitizerControl, DISABLED_PlantedReadPastABufferIsCaught) {
  std::vector<uint8_t> buf(16, 1);
  volatile const uint8_t* p = buf.data();
  const volatile uint8_t past = p[buf.size() + 8];
  EXPECT_EQ(past, past);
}

}  // namespace
}  // namespace specula
