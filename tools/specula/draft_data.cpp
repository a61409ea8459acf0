#include "tools/specula/draft_data.h"

#include <cstring>
#include <fstream>
#include <stdexcept>

#include "tools/specula/args.h"

namespace specula::cli::draft_data {

namespace {

constexpr char kMagic[8] = {'S', 'P', 'D', 'R', 'A', 'F', 'T', '1'};
constexpr size_t kHeaderBytes = 32;

void put_u32(std::string& b, uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); }

template <class T>
void read_exact(std::istream& in, std::vector<T>& v, size_t n, const std::string& what) {
  v.resize(n);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
  if (static_cast<size_t>(in.gcount()) != n * sizeof(T)) throw UsageError(what + ": a record runs past the end of the file");
}

}  // namespace

Header read_header(std::istream& in, const std::string& what) {
  char head[kHeaderBytes] = {};
  in.read(head, kHeaderBytes);
  if (static_cast<size_t>(in.gcount()) < kHeaderBytes) throw UsageError(what + ": shorter than a draft data header (32 bytes)");
  uint32_t f[6];
  std::memcpy(f, head + 8, 24);
  if (std::memcmp(head, kMagic, 8) != 0 || (f[0] != 1 && f[0] != 2))
    throw UsageError(what + ": not a draft data file of version 1 or 2 (docs/draft.md)");
  Header h{f[1], f[2], f[3], {}};
  if (f[0] == 2) {
    if (f[4] > 64) throw UsageError(what + ": " + std::to_string(f[4]) + " feature layers (at most 64)");
    h.feature_layers.resize(f[4]);
    in.read(reinterpret_cast<char*>(h.feature_layers.data()), static_cast<std::streamsize>(4 * h.feature_layers.size()));
    if (static_cast<size_t>(in.gcount()) != 4 * h.feature_layers.size()) throw UsageError(what + ": its header is cut short");
  }
  return h;
}

std::FILE* open_for_append(const std::string& path, const Header& h) {
  const std::string what = "--out " + path;
  std::ifstream in(path, std::ios::binary);
  const bool exists = in && in.peek() != std::char_traits<char>::eof();
  if (exists) {
    const Header got = read_header(in, what);
    if (!(got == h))
      throw UsageError(what + ": its header has hidden " + std::to_string(got.hidden) + ", top-k " + std::to_string(got.topk) +
                       ", vocabulary " + std::to_string(got.vocab) + ", " + std::to_string(got.feature_layers.size()) +
                       " feature layers; this run writes " + std::to_string(h.hidden) + ", " + std::to_string(h.topk) + ", " +
                       std::to_string(h.vocab) + ", " + std::to_string(h.feature_layers.size()));
  }
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (f == nullptr) throw UsageError(what + ": cannot open for appending");
  if (!exists) {
    std::string b(kMagic, 8);
    put_u32(b, h.feature_layers.empty() ? 1 : 2);
    put_u32(b, h.hidden);
    put_u32(b, h.topk);
    put_u32(b, h.vocab);
    put_u32(b, static_cast<uint32_t>(h.feature_layers.size()));
    put_u32(b, 0);
    for (uint32_t l : h.feature_layers) put_u32(b, l);
    std::fwrite(b.data(), 1, b.size(), f);
  }
  return f;
}

void append(std::FILE* f, const Record& r) {
  std::string b;
  put_u32(b, static_cast<uint32_t>(r.tokens.size()));
  put_u32(b, r.n_prompt);
  b.append(reinterpret_cast<const char*>(r.tokens.data()), 4 * r.tokens.size());
  b.append(reinterpret_cast<const char*>(r.hidden.data()), 2 * r.hidden.size());
  b.append(reinterpret_cast<const char*>(r.topk_ids.data()), 4 * r.topk_ids.size());
  b.append(reinterpret_cast<const char*>(r.topk_probs.data()), 2 * r.topk_probs.size());
  if (std::fwrite(b.data(), 1, b.size(), f) != b.size() || std::fflush(f) != 0)
    throw std::runtime_error("--out: write failed (disk full?)");
}

bool read_record(std::istream& in, const Header& h, Record& r, const std::string& what) {
  if (in.peek() == std::char_traits<char>::eof()) return false;
  std::vector<uint32_t> tp;
  read_exact(in, tp, 2, what);
  const size_t T = tp[0];
  r.n_prompt = tp[1];
  read_exact(in, r.tokens, T, what);
  read_exact(in, r.hidden, T * h.row_width(), what);
  read_exact(in, r.topk_ids, T * h.topk, what);
  read_exact(in, r.topk_probs, T * h.topk, what);
  return true;
}

}  // namespace specula::cli::draft_data
