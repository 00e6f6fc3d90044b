/// @file date_task.hpp
/// @brief Lesson 17's synthetic task: a date written one of many ways ("23 November 2026",
/// "Nov 23, 26", "23/11/2026", …) to be rewritten as "2026-11-23". Generated from a seed, so
/// nothing is downloaded and every run sees the same examples.
///
/// The output's characters come from different places of the input in every format (the
/// year first or last, the month as a word or a number), which is what makes the
/// cross-attention of a trained model worth looking at.
#pragma once

#include "attn/random.hpp"

#include <string>

namespace attn {

/// A calendar date, 1950-01-01 to 2049-12-31.
struct Date {
    int year = 2000;  ///< 1950 … 2049 (so that a two-digit year has one reading: 50–99 are 19xx)
    int month = 1;    ///< 1 … 12
    int day = 1;      ///< 1 … the month's length
};

/// The number of ways date_text() writes a date.
inline constexpr int date_format_count = 10;

/// The date as ISO 8601 writes it, the task's target: "2026-11-23".
std::string iso_date(const Date& date);

/// The date written the `format`-th way, for 2026-11-23:
/// 0 "23 November 2026", 1 "November 23, 2026", 2 "Nov 23, 26", 3 "23/11/2026",
/// 4 "23.11.26", 5 "2026/11/23", 6 "23 nov 2026", 7 "Monday, 23 November 2026",
/// 8 "the 23rd of November, 2026", 9 "23-NOV-2026".
/// @throws std::invalid_argument for a format outside [0, date_format_count) or an invalid date
std::string date_text(const Date& date, int format);

/// The day of the week, 0 = Monday … 6 = Sunday (Sakamoto's method).
int weekday(const Date& date);

/// Days since 1950-01-01 (0 for that day).
int day_number(const Date& date);

/// Whether the date belongs to the held-out set: one day in five (day_number divisible by
/// 5), never drawn for training, so that the accuracy is measured on dates the model has
/// not seen in any format.
bool held_out(const Date& date);

/// A date drawn uniformly from the training dates or from the held-out dates.
Date random_date(Rng& rng, bool from_held_out);

/// Every character any format can write: the task's vocabulary.
std::string date_characters();

}  // namespace attn
