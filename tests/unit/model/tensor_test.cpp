// Element types, row sizes and the read-only file mapping.
#include "model/tensor.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

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
  // block_q3_K = 32 + 64 + 12 + 2, block_iq4_xs = 2 + 2 + 4 + 128, block_q2_K = 16 + 64 + 2 + 2.
  const Row rows[] = {{DType::F32, "F32", 1, 4},       {DType::F16, "F16", 1, 2},
                      {DType::BF16, "BF16", 1, 2},     {DType::Q8_0, "Q8_0", 32, 2 + 32},
                      {DType::Q4_0, "Q4_0", 32, 2 + 16}, {DType::Q4_1, "Q4_1", 32, 4 + 16},
                      {DType::Q5_0, "Q5_0", 32, 2 + 4 + 16}, {DType::Q5_1, "Q5_1", 32, 4 + 4 + 16},
                      {DType::Q5_K, "Q5_K", 256, 4 + 12 + 32 + 128}, {DType::IQ4_NL, "IQ4_NL", 32, 2 + 16},
                      {DType::Q3_K, "Q3_K", 256, 32 + 64 + 12 + 2}, {DType::IQ4_XS, "IQ4_XS", 256, 2 + 2 + 4 + 128},
                      {DType::Q4_K, "Q4_K", 256, 4 + 12 + 128}, {DType::Q6_K, "Q6_K", 256, 128 + 64 + 16 + 2},
                      {DType::Q2_K, "Q2_K", 256, 16 + 64 + 2 + 2}};
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
  for (uint32_t id : {4u, 9u, 15u, 28u, 31u, 34u, 35u, 39u, 1000u}) {  // Q4_2, Q8_1, Q8_K, F64, Q4_0_4_4, TQ1_0, TQ2_0, MXFP4
    EXPECT_FALSE(dtype_supported(id)) << id;
    EXPECT_THROW(dtype_info(static_cast<DType>(id)), ModelError) << id;
  }
}

// The IQ1-IQ3 types, by GGUF id, with ggml's block sizes (256 values each).
TEST(DType, LoadsTheIQ1ToIQ3TypesWithGgmlsBlockSizes) {
  const std::pair<uint32_t, int64_t> want[] = {{16, 66}, {17, 74}, {18, 98}, {19, 50}, {21, 110}, {22, 82}, {29, 56}};
  for (const auto& [id, bytes] : want) {
    EXPECT_TRUE(dtype_supported(id)) << id;
    EXPECT_EQ(dtype_info(static_cast<DType>(id)).block_elems, 256) << id;
    EXPECT_EQ(dtype_info(static_cast<DType>(id)).block_bytes, bytes) << id;
  }
  EXPECT_STREQ(dtype_name(DType::IQ2_XXS), "IQ2_XXS");
  EXPECT_STREQ(dtype_name(DType::IQ1_M), "IQ1_M");
}

TEST(DType, KernelsReadEveryLoadableTypeButQ5_0IQ4_NLAndQ3_K) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_1, DType::Q2_K,
                  DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS,
                  DType::IQ3_S, DType::IQ1_S, DType::IQ1_M})
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

// Resident pages of this process, from /proc/self/statm.
long resident_pages() {
  std::ifstream f("/proc/self/statm");
  long size = 0, resident = 0;
  f >> size >> resident;
  return resident;
}

// A packed tensor's pages are dropped from the process (the host device does it after repacking):
// the whole pages inside the range go, the bytes read the same afterwards (faulted back from the
// page cache), and memory that is not a mapped file is never touched (MADV_DONTNEED would zero it).
TEST(MappedFile, ReleasingATensorsPagesDropsThemFromTheProcessAndTheyReadTheSameAfter) {
  test::TempDir dir;
  const size_t n = size_t{16} << 20;
  std::string text(n, '\0');
  for (size_t i = 0; i < n; ++i) text[i] = static_cast<char>('a' + i * 7 % 26);
  test::write_text(dir.file("f"), text);
  MappedFile m(dir.file("f"));
  long sum = 0;
  for (size_t i = 0; i < n; i += 512) sum += static_cast<long>(m.data()[i]);  // fault every page in
  const long before = resident_pages();
  const size_t off = 1000;  // not page-aligned: the partial first and last pages stay
  const size_t released = release_mapped_pages(m.data() + off, n - 2 * off);
  const long page = sysconf(_SC_PAGESIZE);
  EXPECT_EQ(released, n - 2 * static_cast<size_t>(page));
  EXPECT_LT(resident_pages(), before - static_cast<long>(n / 2) / page) << "the pages stayed resident";
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.data()), n), text);
  EXPECT_GT(sum, 0);
  // Outside a mapping, or running past its end: nothing is released, nothing changes.
  std::vector<char> heap(n, 'x');
  EXPECT_EQ(release_mapped_pages(heap.data(), heap.size()), 0u);
  EXPECT_EQ(std::count(heap.begin(), heap.end(), 'x'), static_cast<long>(n));
  EXPECT_EQ(release_mapped_pages(m.data() + n - 4096, 2 * 4096), 0u);
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
