// Element types, row sizes and the read-only file mapping.
#include "model/tensor.h"

#include <gtest/gtest.h>

#include "model/mapped_file.h"
#include "model_file_writer.h"

namespace specula {
namespace {

TEST(DType, DescribesTheBlockGeometryOfEachLoadableType) {
  struct Row {
    DType t;
    const char* name;
    int64_t elems, bytes;
  };
  // ggml-common.h: sizeof(block_q8_0) = 2 + 32, block_q4_0 = 2 + 16, block_q4_1 = 4 + 16,
  // block_q5_0 = 2 + 4 + 16, block_q5_1 = 4 + 4 + 16, block_q4_K = 4 + 12 + 128,
  // block_q5_K = 4 + 12 + 32 + 128, block_q6_K = 128 + 64 + 16 + 2, block_iq4_nl = 2 + 16,
  // block_q3_K = 32 + 64 + 12 + 2, block_iq4_xs = 2 + 2 + 4 + 128.
  const Row rows[] = {{DType::F32, "F32", 1, 4},       {DType::F16, "F16", 1, 2},
                      {DType::BF16, "BF16", 1, 2},     {DType::Q8_0, "Q8_0", 32, 2 + 32},
                      {DType::Q4_0, "Q4_0", 32, 2 + 16}, {DType::Q4_1, "Q4_1", 32, 4 + 16},
                      {DType::Q5_0, "Q5_0", 32, 2 + 4 + 16}, {DType::Q5_1, "Q5_1", 32, 4 + 4 + 16},
                      {DType::Q5_K, "Q5_K", 256, 4 + 12 + 32 + 128}, {DType::IQ4_NL, "IQ4_NL", 32, 2 + 16},
                      {DType::Q3_K, "Q3_K", 256, 32 + 64 + 12 + 2}, {DType::IQ4_XS, "IQ4_XS", 256, 2 + 2 + 4 + 128},
                      {DType::Q4_K, "Q4_K", 256, 4 + 12 + 128}, {DType::Q6_K, "Q6_K", 256, 128 + 64 + 16 + 2}};
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    EXPECT_STREQ(dtype_info(r.t).name, r.name);
    EXPECT_STREQ(dtype_name(r.t), r.name);
    EXPECT_EQ(dtype_info(r.t).block_elems, r.elems);
    EXPECT_EQ(dtype_info(r.t).block_bytes, r.bytes);
    EXPECT_TRUE(dtype_supported(static_cast<uint32_t>(r.t)));
  }
}

TEST(DType, RefusesTypeIdsItCannotLoad) {
  for (uint32_t id : {4u, 9u, 10u, 15u, 21u, 22u, 28u, 29u, 31u, 1000u}) {
    EXPECT_FALSE(dtype_supported(id)) << id;
    EXPECT_THROW(dtype_info(static_cast<DType>(id)), ModelError) << id;
  }
}

TEST(DType, KernelsReadEveryLoadableTypeButQ5_0IQ4_NLAndQ3_K) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_1, DType::Q4_K,
                  DType::Q5_K, DType::Q6_K})
    EXPECT_TRUE(dtype_has_kernels(t)) << dtype_name(t);
  for (DType t : {DType::Q5_0, DType::IQ4_NL, DType::Q3_K}) EXPECT_FALSE(dtype_has_kernels(t)) << dtype_name(t);
}

TEST(DType, GivesTheBytesOfARowOfWholeBlocks) {
  EXPECT_EQ(dtype_row_bytes(DType::F32, 576), 576u * 4);
  EXPECT_EQ(dtype_row_bytes(DType::BF16, 3), 6u);
  EXPECT_EQ(dtype_row_bytes(DType::Q8_0, 576), 18u * 34);
  EXPECT_EQ(dtype_row_bytes(DType::Q4_1, 1536), 48u * 20);
  EXPECT_EQ(dtype_row_bytes(DType::Q4_K, 2048), 8u * 144);
  EXPECT_EQ(dtype_row_bytes(DType::Q6_K, 3072), 12u * 210);
}

TEST(DType, RefusesARowThatSplitsABlock) {
  EXPECT_THROW(dtype_row_bytes(DType::Q8_0, 33), ModelError);
  EXPECT_THROW(dtype_row_bytes(DType::Q6_K, 576), ModelError);  // why SmolLM2 keeps token_embd in Q8_0
  try {
    dtype_row_bytes(DType::Q4_K, 100);
    FAIL();
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("100"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Q4_K"), std::string::npos) << e.what();
  }
}

TEST(TensorView, AddressesRowsOfAQuantizedMatrixByBlockBytes) {
  std::vector<std::byte> buf(3 * 2 * 18);
  TensorView v{"w", DType::Q4_0, {3, 64}, buf.data(), buf.size()};
  EXPECT_EQ(v.numel(), 192);
  EXPECT_EQ(v.rows(), 3);
  EXPECT_EQ(v.cols(), 64);
  EXPECT_EQ(v.row(2), buf.data() + 2 * 36);
}

TEST(MappedFile, MapsTheWholeFileReadOnly) {
  test::TempDir dir;
  test::write_text(dir.file("f"), "hello");
  MappedFile m(dir.file("f"));
  EXPECT_EQ(m.size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.data()), m.size()), "hello");
  EXPECT_EQ(m.path(), dir.file("f"));
}

TEST(MappedFile, NamesThePathAndTheSystemErrorWhenMissing) {
  try {
    MappedFile m("/no/such/specula/file.bin");
    FAIL();
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("/no/such/specula/file.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
}

TEST(MappedFile, RefusesAnEmptyFile) {
  test::TempDir dir;
  test::write_text(dir.file("empty"), "");
  try {
    MappedFile m(dir.file("empty"));
    FAIL();
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
  }
}

TEST(MappedFile, RefusesADirectory) {
  test::TempDir dir;
  try {
    MappedFile m(dir.path().string());
    FAIL();
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("directory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

TEST(ModelError, ControlCharactersAndBrokenUtf8InAMessageAreEscapedOntoOneLine) {
  const ModelError e(std::string("key 'a\nb\x01\x7f' \xff\xc3 caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_EQ(std::string(e.what()), "key 'a\\x0ab\\x01\\x7f' \\xff\\xc3 caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
}

TEST(ModelError, AVeryLongMessageIsCutAtSixHundredBytesWithoutSplittingAnEscape) {
  const ModelError e(std::string(598, 'x') + "\n\n" + std::string(100, 'y'));
  const std::string w = e.what();
  EXPECT_EQ(w, std::string(598, 'x') + "...");
  EXPECT_EQ(std::string(ModelError("short").what()), "short");
}

}  // namespace
}  // namespace specula
