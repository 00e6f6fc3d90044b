#include "attn/data.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>
#include <unordered_map>

namespace attn {

std::vector<std::string> utf8_characters(std::string_view text) {
    std::vector<std::string> out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size();) {
        const auto c = static_cast<unsigned char>(text[i]);
        std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
        if (len == 0 || i + len > text.size())
            throw std::invalid_argument("not valid UTF-8 at byte " + std::to_string(i));
        for (std::size_t k = 1; k < len; ++k)
            if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80)
                throw std::invalid_argument("not valid UTF-8 at byte " + std::to_string(i + k));
        out.emplace_back(text.substr(i, len));
        i += len;
    }
    return out;
}

namespace {
// Orders UTF-8 strings by code point: byte order is code-point order for valid UTF-8.
std::string printable(const std::string& c) {
    if (c == "\n") return "'\\n'";
    if (c == "\t") return "'\\t'";
    return "'" + c + "'";
}
}  // namespace

CharVocab CharVocab::from_text(std::string_view text) {
    const auto chars = utf8_characters(text);
    const std::set<std::string> distinct(chars.begin(), chars.end());
    CharVocab v;
    v.chars_.assign(distinct.begin(), distinct.end());
    return v;
}

CharVocab CharVocab::from_chars(std::string_view chars_in_id_order) {
    CharVocab v;
    v.chars_ = utf8_characters(chars_in_id_order);
    require(!v.chars_.empty(), "vocabulary: no characters");
    const std::set<std::string> distinct(v.chars_.begin(), v.chars_.end());
    require(distinct.size() == v.chars_.size(), "vocabulary: a character appears twice");
    return v;
}

std::string CharVocab::chars() const {
    std::string s;
    for (const auto& c : chars_) s += c;
    return s;
}

std::vector<int> CharVocab::encode(std::string_view text) const {
    std::unordered_map<std::string, int> ids;
    for (std::size_t i = 0; i < chars_.size(); ++i) ids.emplace(chars_[i], static_cast<int>(i));
    std::vector<int> out;
    for (const auto& c : utf8_characters(text)) {
        const auto it = ids.find(c);
        if (it == ids.end())
            throw std::invalid_argument("the character " + printable(c) +
                                        " is not in the model's vocabulary");
        out.push_back(it->second);
    }
    return out;
}

bool CharVocab::can_encode(std::string_view text) const {
    const std::set<std::string> known(chars_.begin(), chars_.end());
    for (const auto& c : utf8_characters(text))
        if (known.count(c) == 0) return false;
    return true;
}

std::string CharVocab::decode(const std::vector<int>& ids) const {
    std::string s;
    for (int id : ids) {
        if (id < 0 || static_cast<std::size_t>(id) >= chars_.size())
            throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                                        std::to_string(chars_.size() - 1) + ")");
        s += chars_[static_cast<std::size_t>(id)];
    }
    return s;
}

std::string read_corpus(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const std::string name = path.string();
    if (!fs::exists(path, ec)) throw std::runtime_error(name + ": no such file");
    if (fs::is_directory(path, ec)) throw std::runtime_error(name + ": is a directory, not a text file");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error(name + ": cannot be read (permission denied?)");
    std::string text;
    try {  // libstdc++ throws from inside the read on an I/O error, and may also just stop
        text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    } catch (const std::exception& e) {
        throw std::runtime_error(name + ": reading it failed part of the way through (" + e.what() + ")");
    }
    if (in.bad()) throw std::runtime_error(name + ": reading it failed part of the way through");
    if (text.empty()) throw std::runtime_error(name + ": the file is empty");
    if (text.find('\0') != std::string::npos)
        throw std::runtime_error(name + ": looks binary (it holds NUL bytes), not text");
    try {
        (void)utf8_characters(text);
    } catch (const std::invalid_argument& e) {
        throw std::runtime_error(name + ": not UTF-8 text (" + e.what() + ")");
    }
    return text;
}

std::filesystem::path course_corpus() {
    const std::filesystem::path p = std::filesystem::path(ATTN_SOURCE_DIR) / "data" / "tinyshakespeare.txt";
    std::error_code ec;
    if (!std::filesystem::is_regular_file(p, ec))
        throw std::runtime_error(p.string() + " is missing: it ships with the course, and "
                                 "./workbook data restores it");
    return p;
}

TextDataset make_dataset(std::string_view text, double val_fraction, std::size_t min_length) {
    require(val_fraction > 0.0 && val_fraction < 1.0, "make_dataset: val_fraction must be in (0, 1)");
    TextDataset d;
    d.vocab = CharVocab::from_text(text);
    std::vector<int> ids = d.vocab.encode(text);
    const auto n_train = static_cast<std::size_t>(std::llround(static_cast<double>(ids.size()) * (1.0 - val_fraction)));
    d.train.assign(ids.begin(), ids.begin() + static_cast<long>(n_train));
    d.val.assign(ids.begin() + static_cast<long>(n_train), ids.end());
    require(d.train.size() > min_length && d.val.size() > min_length,
            "the text is too short: its " + std::to_string(ids.size()) + " characters split into " +
                std::to_string(d.train.size()) + " to train on and " + std::to_string(d.val.size()) +
                " to validate on, and each split needs at least " + std::to_string(min_length + 1));
    return d;
}

void token_window(const std::vector<int>& tokens, std::size_t start, std::size_t T, int* x, int* y,
                  const char* what) {
    // start + T is the last target's position; written so that it cannot overflow.
    require(T <= tokens.size() && start < tokens.size() - T,
            std::string(what) + " has " + std::to_string(tokens.size()) + " tokens; a window of T = " +
                std::to_string(T) + " from position " + std::to_string(start) + " needs at least " +
                std::to_string(start + T + 1));
    std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(start), T, x);
    std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(start + 1), T, y);
}

void sample_batch(const std::vector<int>& data, std::size_t B, std::size_t T, Rng& rng,
                  std::vector<int>& x, std::vector<int>& y) {
    require(data.size() > T, "sample_batch: " + std::to_string(data.size()) +
                                 " tokens cannot hold a sequence of " + std::to_string(T) + " plus its target");
    x.resize(B * T);
    y.resize(B * T);
    for (std::size_t b = 0; b < B; ++b)
        token_window(data, rng.below(data.size() - T), T, x.data() + b * T, y.data() + b * T);
}

void consecutive_windows(const std::vector<int>& tokens, std::size_t n, std::size_t T,
                         std::vector<int>& x, std::vector<int>& y, const char* what) {
    require(T >= 1 && n >= T && n % T == 0,
            "consecutive_windows: " + std::to_string(n) + " targets are not a whole number of windows of T = " +
                std::to_string(T));
    require(tokens.size() > n, std::string(what) + " has " + std::to_string(tokens.size()) +
                                   " tokens; scoring " + std::to_string(n) + " targets at T = " +
                                   std::to_string(T) + " needs at least " + std::to_string(n + 1));
    x.resize(n);
    y.resize(n);
    for (std::size_t start = 0; start < n; start += T)
        token_window(tokens, start, T, x.data() + start, y.data() + start, what);
}

std::size_t targets_to_score(const std::vector<int>& tokens, std::size_t wanted, std::size_t longest,
                             const char* what) {
    require(longest >= 1, "targets_to_score: the longest window must hold a token");
    const std::size_t fit = tokens.empty() ? 0 : (tokens.size() - 1) / longest * longest;
    require(fit >= longest, std::string(what) + " has " + std::to_string(tokens.size()) +
                                " tokens; scoring one window of T = " + std::to_string(longest) +
                                " needs at least " + std::to_string(longest + 1));
    return std::min(wanted, fit);
}

std::string fitting_prompt(const CharVocab& vocab, std::string_view preferred,
                           const std::vector<int>& fallback_text) {
    if (vocab.can_encode(preferred)) return std::string(preferred);
    const std::size_t n = std::min(utf8_characters(preferred).size(), fallback_text.size());
    return vocab.decode(std::vector<int>(fallback_text.begin(), fallback_text.begin() + static_cast<std::ptrdiff_t>(n)));
}

double cosine_lr(std::int64_t step, std::int64_t warmup, std::int64_t decay_steps, double lr_max,
                 double lr_min) {
    if (step < warmup) return lr_max * static_cast<double>(step + 1) / static_cast<double>(warmup + 1);
    if (step > decay_steps) return lr_min;
    const double ratio = static_cast<double>(step - warmup) / static_cast<double>(std::max<std::int64_t>(1, decay_steps - warmup));
    const double coeff = 0.5 * (1.0 + std::cos(3.14159265358979323846 * ratio));
    return lr_min + coeff * (lr_max - lr_min);
}

}  // namespace attn
