// SafetensorsFile and SafetensorsSet on small files: valid, sharded, and with bad headers or offsets.
#include "model/safetensors.h"

#include <gtest/gtest.h>

#include "model_file_writer.h"

namespace specula {
namespace {

using test::Bytes;
using test::TempDir;

std::string error_of(const std::string& path) {
  try {
    SafetensorsFile f(path);
  } catch (const ModelError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string write_raw(const TempDir& dir, const std::string& header, size_t data_bytes, const std::string& name = "bad.safetensors") {
  std::string p = dir.file(name);
  test::write_file(p, test::safetensors_bytes(header, Bytes(data_bytes, 0)));
  return p;
}

TEST(SafetensorsFile, ReadsDtypesShapesAndDataOfEachTensor) {
  test::SafetensorsWriter w;
  w.add_f32("model.norm.weight", {4}, {1.0f, 2.0f, 3.0f, 4.0f});
  w.add("emb", "BF16", {2, 3}, Bytes{0x80, 0x3f, 0x00, 0x40, 0x40, 0x40, 0x80, 0x40, 0xa0, 0x40, 0xc0, 0x40});
  w.add("h", "F16", {1}, Bytes{0x00, 0x3c});
  TempDir dir;
  std::string p = dir.file("model.safetensors");
  test::write_file(p, w.bytes());
  SafetensorsFile f(p);

  ASSERT_EQ(f.tensors().size(), 3u);
  const TensorView* norm = f.tensor("model.norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->dtype, DType::F32);
  EXPECT_EQ(norm->shape, (std::vector<int64_t>{4}));
  float v[4];
  std::memcpy(v, norm->data, 16);
  EXPECT_EQ(v[3], 4.0f);
  const TensorView* emb = f.tensor("emb");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dtype, DType::BF16);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(emb->nbytes, 12u);
  EXPECT_EQ(emb->row(1), emb->data + 6);
  EXPECT_EQ(static_cast<uint8_t>(emb->row(1)[1]), 0x40);
  EXPECT_EQ(f.tensor("h")->dtype, DType::F16);
  EXPECT_EQ(f.tensor("absent"), nullptr);
}

TEST(SafetensorsFile, AcceptsAHeaderPaddedWithSpaces) {
  TempDir dir;
  std::string p = write_raw(dir, R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}    )", 8);
  SafetensorsFile f(p);
  EXPECT_EQ(f.tensor("t")->nbytes, 8u);
}

TEST(SafetensorsFile, RefusesDataOffsetsPastTheEndOfTheData) {
  TempDir dir;
  std::string p = write_raw(dir, R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12);
  std::string e = error_of(p);
  EXPECT_NE(e.find("tensor 't'"), std::string::npos) << e;
  EXPECT_NE(e.find("[0, 16]"), std::string::npos) << e;
  EXPECT_NE(e.find("12 bytes"), std::string::npos) << e;
}

TEST(SafetensorsFile, RefusesDataOffsetsThatDisagreeWithTheShape) {
  TempDir dir;
  std::string p = write_raw(dir, R"({"t":{"dtype":"BF16","shape":[3,4],"data_offsets":[0,20]}})", 32);
  std::string e = error_of(p);
  EXPECT_NE(e.find("20 bytes"), std::string::npos) << e;
  EXPECT_NE(e.find("needs 24"), std::string::npos) << e;
}

TEST(SafetensorsFile, RefusesDataOffsetsThatRunBackwards) {
  TempDir dir;
  std::string p = write_raw(dir, R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8);
  EXPECT_NE(error_of(p).find("backwards"), std::string::npos) << error_of(p);
}

TEST(SafetensorsFile, RefusesNegativeOrNonIntegerOffsets) {
  TempDir dir;
  std::string p = write_raw(dir, R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 8);
  EXPECT_NE(error_of(p).find("non-negative integer"), std::string::npos) << error_of(p);
  p = write_raw(dir, R"({"t":{"dtype":"F32","shape":[1],"data_offsets":["0","4"]}})", 8);
  EXPECT_NE(error_of(p).find("non-negative integer"), std::string::npos) << error_of(p);
}

TEST(SafetensorsFile, RefusesTensorsWhoseDataOverlap) {
  TempDir dir;
  std::string p = write_raw(dir,
                            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            12);
  EXPECT_NE(error_of(p).find("overlap"), std::string::npos) << error_of(p);
}

TEST(SafetensorsFile, RefusesAShapeWhoseSizeOverflows) {
  TempDir dir;
  std::string p = write_raw(dir, R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(error_of(p).find("overflows"), std::string::npos) << error_of(p);
}

TEST(SafetensorsFile, NamesAnUnsupportedDtypeAndItsTensor) {
  TempDir dir;
  std::string p = write_raw(dir, R"({"pos":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(error_of(p).find("tensor 'pos' has dtype I64"), std::string::npos) << error_of(p);
}

TEST(SafetensorsFile, RefusesAHeaderLengthPastTheEndOfTheFile) {
  TempDir dir;
  Bytes b = test::safetensors_bytes(R"({})", {});
  test::put<uint64_t>(b, 0);  // make the file a little longer than 8 + 2
  std::memcpy(b.data(), "\x00\x10\x00\x00\x00\x00\x00\x00", 8);  // 4096
  std::string p = dir.file("t.safetensors");
  test::write_file(p, b);
  std::string e = error_of(p);
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  EXPECT_NE(e.find("4104"), std::string::npos) << e;
}

TEST(SafetensorsFile, RefusesAFileTooShortForTheHeaderLength) {
  TempDir dir;
  std::string p = dir.file("t.safetensors");
  test::write_file(p, Bytes{1, 2, 3});
  EXPECT_NE(error_of(p).find("too short"), std::string::npos) << error_of(p);
}

TEST(SafetensorsFile, NamesTheJsonErrorInAMalformedHeader) {
  TempDir dir;
  std::string p = write_raw(dir, R"({"t":{"dtype":"F32",)", 0);
  std::string e = error_of(p);
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  EXPECT_NE(e.find(p), std::string::npos) << e;
  p = write_raw(dir, R"({"t":{"dtype":"F32","shape":[1]}})", 4);
  EXPECT_NE(error_of(p).find("data_offsets"), std::string::npos) << error_of(p);
}

TEST(SafetensorsSet, GathersTensorsFromTheShardsOfAnIndex) {
  TempDir dir;
  test::SafetensorsWriter a, b;
  a.add_f32("x", {1}, {1.0f});
  b.add_f32("y", {2}, {2.0f, 3.0f});
  test::write_file(dir.file("model-00001-of-00002.safetensors"), a.bytes());
  test::write_file(dir.file("model-00002-of-00002.safetensors"), b.bytes());
  test::write_text(dir.file("model.safetensors.index.json"),
                   R"({"metadata":{},"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}})");
  SafetensorsSet set(dir.path().string());
  EXPECT_EQ(set.names(), (std::vector<std::string>{"x", "y"}));
  ASSERT_NE(set.tensor("y"), nullptr);
  float y1;
  std::memcpy(&y1, set.tensor("y")->data + 4, 4);
  EXPECT_EQ(y1, 3.0f);
  EXPECT_EQ(set.tensor("z"), nullptr);
}

TEST(SafetensorsSet, RefusesAnIndexThatNamesAMissingShard) {
  TempDir dir;
  test::write_text(dir.file("model.safetensors.index.json"), R"({"weight_map":{"x":"model-00001-of-00002.safetensors"}})");
  try {
    SafetensorsSet set(dir.path().string());
    FAIL();
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("model-00001-of-00002.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsSet, RefusesAnIndexThatPlacesATensorInTheWrongShard) {
  TempDir dir;
  test::SafetensorsWriter a;
  a.add_f32("x", {1}, {1.0f});
  test::write_file(dir.file("s.safetensors"), a.bytes());
  test::write_text(dir.file("model.safetensors.index.json"), R"({"weight_map":{"x":"s.safetensors","y":"s.safetensors"}})");
  EXPECT_THROW(SafetensorsSet set(dir.path().string()), ModelError);
}

TEST(SafetensorsSet, RefusesAShardPathOutsideTheDirectory) {
  TempDir dir;
  test::write_text(dir.file("model.safetensors.index.json"), R"({"weight_map":{"x":"../elsewhere.safetensors"}})");
  EXPECT_THROW(SafetensorsSet set(dir.path().string()), ModelError);
}

TEST(SafetensorsSet, RefusesADirectoryWithoutWeights) {
  TempDir dir;
  try {
    SafetensorsSet set(dir.path().string());
    FAIL();
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace specula
