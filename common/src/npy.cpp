#include "attn/npy.hpp"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

namespace attn {

namespace {

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
    throw NpyError(path.string() + ": " + what);
}

// Finds `'key':` in the header dictionary and returns the text after the colon.
std::string header_value(const std::string& header, const std::string& key,
                         const std::filesystem::path& path) {
    const std::string needle = "'" + key + "':";
    const auto pos = header.find(needle);
    if (pos == std::string::npos) fail(path, "not a valid .npy header (no '" + key + "')");
    std::size_t i = pos + needle.size();
    while (i < header.size() && header[i] == ' ') ++i;
    return header.substr(i);
}

std::vector<std::size_t> parse_shape(const std::string& text, const std::filesystem::path& path) {
    if (text.empty() || text[0] != '(') fail(path, "not a valid .npy header (bad shape)");
    const auto close = text.find(')');
    if (close == std::string::npos) fail(path, "not a valid .npy header (bad shape)");
    std::vector<std::size_t> shape;
    std::stringstream ss(text.substr(1, close - 1));
    std::string item;
    while (std::getline(ss, item, ',')) {
        const auto first = item.find_first_not_of(' ');
        if (first == std::string::npos) continue;
        try {
            shape.push_back(static_cast<std::size_t>(std::stoull(item.substr(first))));
        } catch (const std::exception&) {
            fail(path, "not a valid .npy header (bad shape entry '" + item + "')");
        }
    }
    return shape;
}

template <class T>
void convert(const std::vector<char>& raw, std::vector<float>& out) {
    for (std::size_t i = 0; i < out.size(); ++i) {
        T v;
        std::memcpy(&v, raw.data() + i * sizeof(T), sizeof(T));
        out[i] = static_cast<float>(v);
    }
}

}  // namespace

NpyArray read_npy(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(path, std::filesystem::exists(path) ? "cannot be read" : "no such file");
    char magic[8];
    if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
        fail(path, "not a .npy file (bad magic bytes)");
    const int major = static_cast<unsigned char>(magic[6]);
    std::uint32_t header_len = 0;
    if (major == 1) {
        unsigned char b[2];
        if (!in.read(reinterpret_cast<char*>(b), 2)) fail(path, "truncated header");
        header_len = b[0] | (b[1] << 8);
    } else if (major == 2 || major == 3) {
        unsigned char b[4];
        if (!in.read(reinterpret_cast<char*>(b), 4)) fail(path, "truncated header");
        header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<std::uint32_t>(b[3]) << 24);
    } else {
        fail(path, "unsupported .npy version " + std::to_string(major));
    }
    if (header_len > (1u << 20)) fail(path, "not a valid .npy header (too long)");
    std::string header(header_len, '\0');
    if (!in.read(header.data(), header_len)) fail(path, "truncated header");

    NpyArray a;
    const std::string descr = header_value(header, "descr", path);
    if (descr.size() < 5 || descr[0] != '\'') fail(path, "not a valid .npy header (bad descr)");
    a.dtype = descr.substr(1, descr.find('\'', 1) - 1);
    if (header_value(header, "fortran_order", path).rfind("False", 0) != 0)
        fail(path, "Fortran-order arrays are not supported; save with np.ascontiguousarray");
    a.shape = parse_shape(header_value(header, "shape", path), path);

    std::size_t count = 1;
    for (std::size_t d : a.shape) count *= d;
    std::size_t item = 0;
    if (a.dtype == "<f4") item = 4;
    else if (a.dtype == "<f8") item = 8;
    else if (a.dtype == "|b1") item = 1;
    else if (a.dtype == "<i4") item = 4;
    else if (a.dtype == "<i8") item = 8;
    else fail(path, "unsupported dtype '" + a.dtype + "' (expected <f4, <f8, |b1, <i4 or <i8)");

    std::vector<char> raw(count * item);
    in.read(raw.data(), static_cast<std::streamsize>(raw.size()));
    if (static_cast<std::size_t>(in.gcount()) != raw.size())
        fail(path, "truncated: shape " + format_shape(a.shape) + " needs " +
                       std::to_string(raw.size()) + " data bytes, the file has " +
                       std::to_string(in.gcount()));
    a.data.resize(count);
    if (a.dtype == "<f4") convert<float>(raw, a.data);
    else if (a.dtype == "<f8") convert<double>(raw, a.data);
    else if (a.dtype == "|b1") convert<std::uint8_t>(raw, a.data);
    else if (a.dtype == "<i4") convert<std::int32_t>(raw, a.data);
    else convert<std::int64_t>(raw, a.data);
    return a;
}

void write_npy(const std::filesystem::path& path, const std::vector<std::size_t>& shape,
               const float* data) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " +
                         format_shape(shape) + ", }";
    // The header, with the 10-byte preamble, is padded with spaces to a multiple of 64
    // and ends in a newline, as NumPy writes it.
    const std::size_t total = 10 + header.size() + 1;
    header.append((64 - total % 64) % 64, ' ');
    header += '\n';
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) fail(path, "cannot be opened for writing");
    const char preamble[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
    out.write(preamble, 8);
    const auto len = static_cast<std::uint16_t>(header.size());
    const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
    out.write(len_bytes, 2);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    std::size_t count = 1;
    for (std::size_t d : shape) count *= d;
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(count * 4));
    if (!out) fail(path, "write failed");
}

}  // namespace attn
