/// @file data.hpp
/// @brief Text as training data: a character vocabulary, the train/val split, batches, and
/// the learning-rate schedule.
#pragma once

#include "attn/random.hpp"

#include <cstdint>
#include <filesystem>
#include <iosfwd>
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
    /// Decodes ids; @throws std::invalid_argument for an id outside 0…V−1.
    std::string decode(const std::vector<int>& ids) const;

private:
    std::vector<std::string> chars_;
};

/// Splits UTF-8 text into characters (code points, each as its UTF-8 bytes).
/// @throws std::invalid_argument if the bytes are not valid UTF-8
std::vector<std::string> utf8_characters(std::string_view text);

/// Reads a text corpus.
/// @throws std::runtime_error naming the file if it is missing, unreadable, empty, or
/// binary (it holds NUL bytes or is not valid UTF-8)
std::string read_corpus(const std::filesystem::path& path);

/// The corpus the lessons train on: tiny shakespeare where `./workbook data` puts it
/// (`data/tinyshakespeare.txt` in the course's folder, or under the current directory),
/// else `data/fallback.txt`, else the fortunes file of Debian's fortunes-min.
/// @param note  if not null, receives one line when the corpus is not tiny shakespeare
/// @throws std::runtime_error saying how to get a corpus when there is none
std::filesystem::path find_corpus(std::ostream* note = nullptr);

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

/// nanoGPT's learning-rate schedule: linear warm-up over the first `warmup` steps, then a
/// cosine decay from `lr_max` to `lr_min` at step `decay_steps`, then `lr_min`.
double cosine_lr(std::int64_t step, std::int64_t warmup, std::int64_t decay_steps, double lr_max,
                 double lr_min);

}  // namespace attn
