// GgufFile on files written byte by byte: a valid round trip, then truncated and corrupt ones.
#include "model/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "model_file_writer.h"

namespace specula {
namespace {

using test::Bytes;
using test::GgufWriter;
using test::TempDir;

// Runs `fn`, expecting a ModelError whose message contains every one of `parts`.
template <class Fn>
void expect_model_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected a ModelError";
  } catch (const ModelError& e) {
    std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "error should be one line: " << msg;
  }
}

std::vector<float> iota_floats(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

// Two tensors whose data sizes are multiples of 32, so the file ends exactly where data ends.
GgufWriter two_tensor_writer() {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.block_count", 2);
  w.add_f32_tensor("a.weight", {4, 8}, iota_floats(32, 0.0f));  // 128 bytes
  w.add_f32_tensor("b.weight", {8}, iota_floats(8, 100.0f));     // 32 bytes
  return w;
}

std::string write(const TempDir& dir, const Bytes& b, const std::string& name = "m.gguf") {
  std::string p = dir.file(name);
  test::write_file(p, b);
  return p;
}

template <class T>
void poke(Bytes& b, size_t pos, T v) {
  std::memcpy(b.data() + pos, &v, sizeof(T));
}

TEST(GgufFile, ReadsMetadataOfEveryValueType) {
  GgufWriter w;
  w.add("k.u8", GgufWriter::U8, uint8_t{200});
  w.add("k.i8", GgufWriter::I8, int8_t{-100});
  w.add("k.u16", GgufWriter::U16, uint16_t{60000});
  w.add("k.i16", GgufWriter::I16, int16_t{-30000});
  w.add("k.u32", GgufWriter::U32, uint32_t{4000000000u});
  w.add("k.i32", GgufWriter::I32, int32_t{-2000000000});
  w.add("k.u64", GgufWriter::U64, uint64_t{1} << 40);
  w.add("k.i64", GgufWriter::I64, -(int64_t{1} << 40));
  w.add("k.f32", GgufWriter::F32, 0.25f);
  w.add("k.f64", GgufWriter::F64, -1.0e-300);
  w.add("k.bool", GgufWriter::BOOL, uint8_t{1});
  w.add_string("k.str", "héllo");
  w.add_strings("k.strs", {"a b", "", "c"});
  w.add_i32s("k.ints", {1, -2, 3});
  w.add_f32s("k.floats", {0.5f, -1.5f});
  TempDir dir;
  GgufFile f(write(dir, w.bytes()));

  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_int("k.u8"), 200);
  EXPECT_EQ(f.get_int("k.i8"), -100);
  EXPECT_EQ(f.get_int("k.u16"), 60000);
  EXPECT_EQ(f.get_int("k.i16"), -30000);
  EXPECT_EQ(f.get_int("k.u32"), 4000000000LL);
  EXPECT_EQ(f.get_int("k.i32"), -2000000000);
  EXPECT_EQ(f.get_int("k.u64"), int64_t{1} << 40);
  EXPECT_EQ(f.get_int("k.i64"), -(int64_t{1} << 40));
  EXPECT_EQ(f.get_float("k.f32"), 0.25);
  EXPECT_EQ(f.get_float("k.f64"), -1.0e-300);
  EXPECT_TRUE(f.get_bool("k.bool", false));
  EXPECT_EQ(f.get_string("k.str"), "héllo");
  EXPECT_EQ(f.get_string_array("k.strs"), (std::vector<std::string>{"a b", "", "c"}));
  EXPECT_EQ(f.get_int_array("k.ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.get_float_array("k.floats"), (std::vector<double>{0.5, -1.5}));
  EXPECT_EQ(f.metadata().size(), 15u);
}

TEST(GgufFile, FallsBackOnlyWhenAKeyIsAbsent) {
  GgufWriter w;
  w.add_u32("present", 7);
  TempDir dir;
  GgufFile f(write(dir, w.bytes()));
  EXPECT_EQ(f.get_int("present", 1), 7);
  EXPECT_EQ(f.get_int("absent", 1), 1);
  EXPECT_EQ(f.get_string("absent", "x"), "x");
  EXPECT_EQ(f.find("absent"), nullptr);
  expect_model_error([&] { f.get_int("absent"); }, {"absent", "no metadata key"});
  expect_model_error([&] { f.get_string("present"); }, {"'present'", "unsigned integer", "expected a string"});
}

TEST(GgufFile, ReportsTensorShapesOutermostFirstWithViewsOntoTheirData) {
  GgufWriter w;
  std::vector<float> a = iota_floats(12, 1.0f);
  Bytes q8(2 * 34);
  for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<uint8_t>(i * 7);
  w.add_f32_tensor("a", {3, 4}, a);
  w.add_tensor("q", DType::Q8_0, {2, 32}, q8);
  w.add_tensor("h", DType::F16, {5}, Bytes(10, 0x3c));
  TempDir dir;
  GgufFile f(write(dir, w.bytes()));

  ASSERT_EQ(f.tensors().size(), 3u);
  const TensorView* ta = f.tensor("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(ta->dtype, DType::F32);
  EXPECT_EQ(ta->nbytes, 48u);
  EXPECT_EQ(ta->rows(), 3);
  EXPECT_EQ(ta->cols(), 4);
  EXPECT_EQ(std::memcmp(ta->data, a.data(), 48), 0);
  float row2_col1;
  std::memcpy(&row2_col1, ta->row(2) + 4, 4);
  EXPECT_EQ(row2_col1, a[2 * 4 + 1]);

  const TensorView* tq = f.tensor("q");
  ASSERT_NE(tq, nullptr);
  EXPECT_EQ(tq->shape, (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(tq->dtype, DType::Q8_0);
  EXPECT_EQ(tq->nbytes, 68u);
  EXPECT_EQ(std::memcmp(tq->data, q8.data(), q8.size()), 0);
  EXPECT_EQ(tq->row(1), tq->data + 34);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(tq->data) % 32, 0u) << "tensor data is aligned to general.alignment";

  EXPECT_EQ(f.tensor("h")->nbytes, 10u);
  EXPECT_EQ(f.tensor("missing"), nullptr);
}

TEST(GgufFile, AcceptsVersionTwo) {
  GgufWriter w = two_tensor_writer();
  w.version = 2;
  TempDir dir;
  GgufFile f(write(dir, w.bytes()));
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.tensors().size(), 2u);
}

TEST(GgufFile, PlacesDataAtTheAlignmentTheFileAsksFor) {
  GgufWriter w = two_tensor_writer();
  w.alignment = 256;
  w.add_u32("general.alignment", 256);
  TempDir dir;
  Bytes b = w.bytes();
  GgufFile f(write(dir, b));
  EXPECT_EQ(f.tensor("a.weight")->data, f.mapping()->data() + w.layout().data_start);
  EXPECT_EQ(w.layout().data_start % 256, 0u);
  float first_b;
  std::memcpy(&first_b, f.tensor("b.weight")->data, 4);
  EXPECT_EQ(first_b, 100.0f);
}

TEST(GgufFile, RefusesAnAlignmentThatIsNotAPowerOfTwo) {
  GgufWriter w = two_tensor_writer();
  w.add_u32("general.alignment", 48);
  TempDir dir;
  std::string p = write(dir, w.bytes());
  expect_model_error([&] { GgufFile f(p); }, {"general.alignment", "48", "power of two"});
}

TEST(GgufFile, SkipsAnArrayOfArraysAndReadsTheKeysAfterIt) {
  GgufWriter w;
  Bytes nested;
  test::put<uint32_t>(nested, GgufWriter::ARRAY);
  test::put<uint64_t>(nested, 2);
  for (int i = 0; i < 2; ++i) {
    test::put<uint32_t>(nested, GgufWriter::STRING);
    test::put<uint64_t>(nested, 1);
    test::put_string(nested, "inner");
  }
  w.add_raw("nested", GgufWriter::ARRAY, nested);
  w.add_u32("after", 5);
  TempDir dir;
  GgufFile f(write(dir, w.bytes()));
  EXPECT_FALSE(f.has("nested"));
  EXPECT_EQ(f.get_int("after"), 5);
}

TEST(GgufFile, RefusesAMissingFileNamingThePath) {
  expect_model_error([] { GgufFile f("/nonexistent/dir/model.gguf"); }, {"/nonexistent/dir/model.gguf", "No such file"});
}

TEST(GgufFile, RefusesAnEmptyFile) {
  TempDir dir;
  std::string p = write(dir, {});
  expect_model_error([&] { GgufFile f(p); }, {p, "empty"});
}

TEST(GgufFile, RefusesAFileThatIsNotGguf) {
  TempDir dir;
  std::string p = write(dir, Bytes{'{', '"', 'a', '"', ':', '1', '}', '\n'});
  expect_model_error([&] { GgufFile f(p); }, {p, "not a GGUF file"});
}

TEST(GgufFile, RefusesAnUnsupportedVersion) {
  GgufWriter w = two_tensor_writer();
  w.version = 1;
  TempDir dir;
  std::string p = write(dir, w.bytes());
  expect_model_error([&] { GgufFile f(p); }, {"version 1"});
}

TEST(GgufFile, RefusesABigEndianFile) {
  GgufWriter w = two_tensor_writer();
  w.version = 0x03000000;  // what a little-endian reader sees of a big-endian 3
  TempDir dir;
  std::string p = write(dir, w.bytes());
  expect_model_error([&] { GgufFile f(p); }, {"big-endian"});
}

// Cuts inside each part of the file; each must be reported as truncated with both sizes.
TEST(GgufFile, ReportsATruncatedFileWithTheExpectedAndActualSize) {
  GgufWriter w = two_tensor_writer();
  const Bytes full = w.bytes();
  const GgufWriter::Layout l = w.layout();
  struct Cut {
    const char* where;
    size_t at;
  };
  const Cut cuts[] = {
      {"magic", 3},
      {"header counts", 12},
      {"first key", l.kv_start + 5},
      {"a metadata value", l.infos_start - 2},
      {"tensor infos", l.infos_start + 10},
      {"last tensor info", l.offset_fields[1] + 3},
      {"padding before the data", l.data_start - 1},
      {"first tensor's data", l.data_start + 64},
      {"last tensor's data", full.size() - 1},
  };
  TempDir dir;
  for (const Cut& c : cuts) {
    SCOPED_TRACE(c.where);
    ASSERT_LT(c.at, full.size());
    std::string p = write(dir, Bytes(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(c.at)));
    expect_model_error([&] { GgufFile f(p); }, {p, "truncated", "the file has " + std::to_string(c.at) + " bytes"});
  }
}

TEST(GgufFile, ReportsTheSizeATruncatedTensorNeeds) {
  GgufWriter w = two_tensor_writer();
  Bytes full = w.bytes();
  TempDir dir;
  std::string p = write(dir, Bytes(full.begin(), full.end() - 8));
  expect_model_error([&] { GgufFile f(p); },
                     {"tensor 'b.weight'", "needs a file of " + std::to_string(full.size()) + " bytes",
                      "the file has " + std::to_string(full.size() - 8) + " bytes"});
}

TEST(GgufFile, NeverFailsOtherThanWithAModelErrorWhereverTheFileIsCut) {
  GgufWriter w = two_tensor_writer();
  w.add_strings("tokens", {"x", "yy", "zzz"});
  const Bytes full = w.bytes();
  TempDir dir;
  for (size_t n = 0; n < full.size(); ++n) {
    std::string p = write(dir, Bytes(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n)));
    EXPECT_THROW(GgufFile f(p), ModelError) << "cut at " << n << " of " << full.size();
  }
}

TEST(GgufFile, NeverFailsOtherThanWithAModelErrorWhenAHeaderByteIsCorrupted) {
  GgufWriter w = two_tensor_writer();
  w.add_strings("tokens", {"x", "yy", "zzz"});
  const Bytes full = w.bytes();
  TempDir dir;
  std::string p = dir.file("c.gguf");
  for (size_t pos = 0; pos < w.layout().data_start; ++pos) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0x7f}, uint8_t{0xff}}) {
      Bytes b = full;
      b[pos] = v;
      test::write_file(p, b);
      try {
        GgufFile f(p);
        for (const TensorView& t : f.tensors())  // a file that loads must have views inside it
          ASSERT_LE(t.data + t.nbytes, f.mapping()->data() + f.mapping()->size());
      } catch (const ModelError&) {
      }
    }
  }
}

TEST(GgufFile, RefusesAnAbsurdArrayCountBeforeAllocating) {
  GgufWriter w;
  Bytes p;
  test::put<uint32_t>(p, GgufWriter::STRING);
  test::put<uint64_t>(p, uint64_t{1} << 60);
  test::put_string(p, "only one");
  w.add_raw("tokenizer.ggml.tokens", GgufWriter::ARRAY, p);
  TempDir dir;
  std::string path = write(dir, w.bytes());
  expect_model_error([&] { GgufFile f(path); }, {"tokenizer.ggml.tokens", std::to_string(uint64_t{1} << 60), "truncated or corrupt"});
}

TEST(GgufFile, RefusesAnAbsurdStringLength) {
  GgufWriter w;
  Bytes p;
  test::put<uint64_t>(p, uint64_t{1} << 62);
  p.insert(p.end(), {'a', 'b'});
  w.add_raw("general.name", GgufWriter::STRING, p);
  TempDir dir;
  std::string path = write(dir, w.bytes());
  expect_model_error([&] { GgufFile f(path); }, {"general.name", "truncated"});
}

TEST(GgufFile, RefusesAnAbsurdTensorCount) {
  Bytes b = two_tensor_writer().bytes();
  poke<uint64_t>(b, 8, uint64_t{1} << 40);
  TempDir dir;
  std::string path = write(dir, b);
  expect_model_error([&] { GgufFile f(path); }, {"claims " + std::to_string(uint64_t{1} << 40) + " tensor infos"});
}

TEST(GgufFile, RefusesATensorWhoseOffsetRunsPastTheEnd) {
  GgufWriter w = two_tensor_writer();
  Bytes b = w.bytes();
  poke<uint64_t>(b, w.layout().offset_fields[1], uint64_t{1} << 40);
  TempDir dir;
  std::string path = write(dir, b);
  expect_model_error([&] { GgufFile f(path); }, {"tensor 'b.weight'", std::to_string(uint64_t{1} << 40), "past the end"});
}

TEST(GgufFile, RefusesATensorOffsetThatWrapsAroundSixtyFourBits) {
  GgufWriter w = two_tensor_writer();
  Bytes b = w.bytes();
  poke<uint64_t>(b, w.layout().offset_fields[1], std::numeric_limits<uint64_t>::max() - 31);
  TempDir dir;
  std::string path = write(dir, b);
  expect_model_error([&] { GgufFile f(path); }, {"tensor 'b.weight'", "past the end"});
}

TEST(GgufFile, RefusesAMisalignedTensorOffset) {
  GgufWriter w = two_tensor_writer();
  Bytes b = w.bytes();
  poke<uint64_t>(b, w.layout().offset_fields[1], 4);
  TempDir dir;
  std::string path = write(dir, b);
  expect_model_error([&] { GgufFile f(path); }, {"tensor 'b.weight'", "offset 4", "alignment 32"});
}

TEST(GgufFile, RefusesTensorsWhoseDataOverlap) {
  GgufWriter w = two_tensor_writer();
  Bytes b = w.bytes();
  poke<uint64_t>(b, w.layout().offset_fields[1], 32);  // inside a.weight's 128 bytes
  TempDir dir;
  std::string path = write(dir, b);
  expect_model_error([&] { GgufFile f(path); }, {"'a.weight'", "'b.weight'", "overlap"});
}

TEST(GgufFile, NamesAnUnsupportedTensorTypeAndItsId) {
  GgufWriter w;
  w.add_tensor("blk.0.attn_q.weight", uint32_t{34}, {1, 256}, Bytes(54));
  TempDir dir;
  std::string path = write(dir, w.bytes());
  expect_model_error([&] { GgufFile f(path); }, {"tensor 'blk.0.attn_q.weight' has type TQ1_0 (34), which Specula cannot load"});
}

TEST(GgufFile, NamesATypeIdBeyondAnyKnownType) {
  GgufWriter w;
  w.add_tensor("t", uint32_t{999}, {4}, Bytes(16));
  TempDir dir;
  std::string path = write(dir, w.bytes());
  expect_model_error([&] { GgufFile f(path); }, {"tensor 't'", "(999)"});
}

TEST(GgufFile, RefusesMoreThanFourDimensions) {
  GgufWriter w;
  w.add_f32_tensor("t", {1, 1, 1, 1, 2}, {1.0f, 2.0f});
  TempDir dir;
  std::string path = write(dir, w.bytes());
  expect_model_error([&] { GgufFile f(path); }, {"tensor 't'", "5 dimensions"});
}

TEST(GgufFile, RefusesDimensionsWhoseProductOverflows) {
  GgufWriter w;
  w.add_f32_tensor("t", {int64_t{1} << 32, int64_t{1} << 32}, {1.0f});
  TempDir dir;
  std::string path = write(dir, w.bytes());
  expect_model_error([&] { GgufFile f(path); }, {"tensor 't'", "overflow"});
}

TEST(GgufFile, RefusesARowThatIsNotAWholeNumberOfBlocks) {
  GgufWriter w;
  w.add_tensor("t", DType::Q4_0, {2, 48}, Bytes(2 * 27));
  TempDir dir;
  std::string path = write(dir, w.bytes());
  expect_model_error([&] { GgufFile f(path); }, {"tensor 't'", "48", "Q4_0", "32"});
}

TEST(GgufFile, RefusesADuplicateKey) {
  GgufWriter w;
  w.add_u32("general.alignment", 32);
  w.add_u32("general.alignment", 32);
  TempDir dir;
  std::string path = write(dir, w.bytes());
  expect_model_error([&] { GgufFile f(path); }, {"general.alignment", "twice"});
}

TEST(GgufFile, RefusesADuplicateTensorName) {
  GgufWriter w;
  w.add_f32_tensor("t", {8}, iota_floats(8, 0));
  w.add_f32_tensor("t", {8}, iota_floats(8, 0));
  TempDir dir;
  std::string path = write(dir, w.bytes());
  expect_model_error([&] { GgufFile f(path); }, {"tensor 't'", "twice"});
}

TEST(GgufFile, RefusesAnUnknownValueType) {
  GgufWriter w;
  w.add("k", 77, uint32_t{0});
  TempDir dir;
  std::string path = write(dir, w.bytes());
  expect_model_error([&] { GgufFile f(path); }, {"'k'", "unknown value type 77"});
}

}  // namespace
}  // namespace specula
