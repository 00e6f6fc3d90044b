/// @file data.hpp
/// @brief Text as training data: a character vocabulary, the train/val split, batches, and
/// the learning-rate schedule.
#pragma once

#include "attn/random.hpp"

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace attn {

/// A character-level vocabulary: the distinct characters (Unicode code points, held as
/// UTF-8 strings) of a text, sorted, with ids 0…V−1 in that order.
class CharVocab {
public:
    CharVocab() = default;
    /// The vocabulary of `text`: its distinct characters, sorted by code point.
    static CharVocab from_text(std::string_view text);
    /// A vocabulary given as its characters in id order, as stored in `config.json`.
    /// @throws std::invalid_argument if a character repeats or the string is empty
    static CharVocab from_chars(std::string_view chars_in_id_order);

    std::size_t size() const { return chars_.size(); }  ///< V
    /// The characters in id order, concatenated (the form `config.json` stores).
    std::string chars() const;
    /// The character with id `id`, as UTF-8.
    const std::string& at(int id) const { return chars_.at(static_cast<std::size_t>(id)); }
    /// Encodes a text; @throws std::invalid_argument naming the first character that is not
    /// in the vocabulary.
    std::vector<int> encode(std::string_view text) const;
    /// Whether every character of `text` is in the vocabulary (so encode() would not throw).
    bool can_encode(std::string_view text) const;
    /// Decodes ids; @throws std::invalid_argument for an id outside 0…V−1.
    std::string decode(const std::vector<int>& ids) const;

private:
    std::vector<std::string> chars_;
};

/// Splits UTF-8 text into characters (code points, each as its UTF-8 bytes).
/// @throws std::invalid_argument if the bytes are not valid UTF-8
std::vector<std::string> utf8_characters(std::string_view text);

/// Reads a text corpus.
/// @throws std::runtime_error naming the file, in one line, if it is missing, a directory,
/// unreadable, empty, or binary (it holds NUL bytes or is not valid UTF-8)
std::string read_corpus(const std::filesystem::path& path);

/// The corpus the course trains on: tiny shakespeare, `data/tinyshakespeare.txt` in the
/// course's folder, which ships with the course. Nothing outside the course's folder is read.
/// @throws std::runtime_error saying how to restore it when it is missing
std::filesystem::path course_corpus();

/// A text encoded for training: the vocabulary and the two splits of the token ids.
struct TextDataset {
    CharVocab vocab;         ///< built from the whole text
    std::vector<int> train;  ///< the first (1 − val_fraction) of the text
    std::vector<int> val;    ///< the rest
};

/// Encodes `text` and splits it: the first 90% (by default) to train on, the last 10% to
/// validate on, in order, as nanoGPT's character-level data preparation does.
/// @throws std::invalid_argument if a split would be too short to hold one sequence of
/// `min_length` tokens plus its target
TextDataset make_dataset(std::string_view text, double val_fraction = 0.1,
                         std::size_t min_length = 1);

/// One (x, y) window of a token sequence: the inputs x = tokens[start, start + T) and the
/// targets y = tokens[start + 1, start + T], written to `x` and `y` (T each). Every slice of
/// tokens into training or evaluation windows goes through here, so every one is checked.
/// @param tokens  the token ids, e.g. TextDataset::val
/// @param start   the first input's position
/// @param T       the window's length
/// @param x       (T) receives the inputs
/// @param y       (T) receives the targets
/// @param what    what `tokens` is, for the message, e.g. "the validation split"
/// @throws std::invalid_argument naming the sizes if tokens[start + T] is past the end
void token_window(const std::vector<int>& tokens, std::size_t start, std::size_t T, int* x, int* y,
                  const char* what = "the token sequence");

/// Draws a batch of B sequences of T tokens starting at random offsets, and their targets,
/// the same sequences shifted by one token.
/// @param data  the token ids to draw from, e.g. TextDataset::train
/// @param B     the number of sequences
/// @param T     the length of each sequence
/// @param rng   the seeded source of the start offsets
/// @param x     (B·T) filled with the inputs, row-major (B, T)
/// @param y     (B·T) filled with the targets: y[b][t] = x[b][t + 1]'s token
/// @throws std::invalid_argument if `data` holds T tokens or fewer
void sample_batch(const std::vector<int>& data, std::size_t B, std::size_t T, Rng& rng,
                  std::vector<int>& x, std::vector<int>& y);

/// The first `n` next-token predictions of `tokens` as n / T consecutive windows of T:
/// x (n/T, T) = tokens[0, n), y the same shifted by one. Scoring them scores the same n
/// targets at any T that divides n, each with the context its window gives it.
/// @param tokens the token ids, e.g. TextDataset::val
/// @param n     the number of targets; a multiple of T
/// @param T     the length of each window
/// @param x     (n/T · T) filled with the inputs, row-major (n/T, T)
/// @param y     (n/T · T) filled with the targets: x shifted by one token
/// @param what  what `tokens` is, for the message, e.g. "the validation split"
/// @throws std::invalid_argument naming the sizes if T does not divide n or `tokens` holds
/// n tokens or fewer ("the validation split has 2452 tokens; scoring 4096 targets at
/// T = 512 needs at least 4097")
void consecutive_windows(const std::vector<int>& tokens, std::size_t n, std::size_t T,
                         std::vector<int>& x, std::vector<int>& y, const char* what);

/// How many targets of `tokens` to score in consecutive windows of every length up to
/// `longest` (see consecutive_windows): `wanted`, or on a shorter text the largest multiple
/// of `longest` that it holds.
/// @throws std::invalid_argument naming the sizes if not even one window of `longest` fits
std::size_t targets_to_score(const std::vector<int>& tokens, std::size_t wanted, std::size_t longest,
                             const char* what);

/// `preferred` if every one of its characters is in the vocabulary, else the first
/// `preferred`-many characters of `fallback_text` (a prompt that fits any corpus).
std::string fitting_prompt(const CharVocab& vocab, std::string_view preferred,
                           const std::vector<int>& fallback_text);

/// nanoGPT's learning-rate schedule: linear warm-up over the first `warmup` steps, then a
/// cosine decay from `lr_max` to `lr_min` at step `decay_steps`, then `lr_min`.
double cosine_lr(std::int64_t step, std::int64_t warmup, std::int64_t decay_steps, double lr_max,
                 double lr_min);

}  // namespace attn
