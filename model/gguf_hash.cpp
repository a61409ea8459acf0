#include "model/gguf_hash.h"

#include <openssl/evp.h>

#include <bit>
#include <cstdint>
#include <memory>
#include <stdexcept>

namespace specula {

namespace {

struct DigestDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

void put(EVP_MD_CTX* c, const void* p, size_t n) {
  if (EVP_DigestUpdate(c, p, n) != 1) throw std::runtime_error("sha256: EVP_DigestUpdate failed");
}
template <class T>
void put_le(EVP_MD_CTX* c, T v) {
  static_assert(std::endian::native == std::endian::little, "the hash is defined little-endian");
  put(c, &v, sizeof v);
}

}  // namespace

std::string gguf_tensor_hash(const GgufFile& f) {
  std::unique_ptr<EVP_MD_CTX, DigestDeleter> c(EVP_MD_CTX_new());
  if (!c || EVP_DigestInit_ex(c.get(), EVP_sha256(), nullptr) != 1) throw std::runtime_error("sha256: cannot initialise");
  for (const TensorView& t : f.tensors()) {
    put_le<uint64_t>(c.get(), t.name.size());
    put(c.get(), t.name.data(), t.name.size());
    put_le<uint32_t>(c.get(), static_cast<uint32_t>(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) put_le<uint64_t>(c.get(), static_cast<uint64_t>(*d));
    put_le<uint32_t>(c.get(), static_cast<uint32_t>(t.dtype));
    put_le<uint64_t>(c.get(), t.nbytes);
    put(c.get(), t.data, t.nbytes);
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(c.get(), md, &len) != 1) throw std::runtime_error("sha256: EVP_DigestFinal_ex failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

}  // namespace specula
