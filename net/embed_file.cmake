# Writes a C++ source that holds a file's bytes: chat_page_html() for net/web/index.html.
# cmake -DINPUT=FILE -DOUTPUT=FILE.cpp -P embed_file.cmake (run at build time, so editing the page
# rebuilds the binary; the server never reads files at run time).
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR size "${hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){24})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUTPUT}.tmp" "// Generated from ${INPUT} by net/embed_file.cmake; do not edit.
#include <string_view>

namespace specula::net {
namespace {
const unsigned char kBytes[] = {
${bytes}0x00};
}  // namespace
std::string_view chat_page_html() { return {reinterpret_cast<const char*>(kBytes), ${size}}; }
}  // namespace specula::net
")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
