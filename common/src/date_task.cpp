// Lesson 17's dates: one date written ten ways, and the ISO form to turn them into.
#include "attn/date_task.hpp"

#include "attn/data.hpp"  // CharVocab
#include "attn/tensor.hpp"

#include <cctype>
#include <cstdio>
#include <string>

namespace attn {

namespace {

const char* const month_names[12] = {"January", "February", "March",     "April",   "May",      "June",
                                     "July",    "August",   "September", "October", "November", "December"};
const char* const weekday_names[7] = {"Monday", "Tuesday", "Wednesday", "Thursday",
                                      "Friday", "Saturday", "Sunday"};

bool leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

int month_length(int y, int m) {
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return m == 2 && leap(y) ? 29 : days[m - 1];
}

void check(const Date& d) {
    require(d.year >= 1950 && d.year <= 2049 && d.month >= 1 && d.month <= 12 && d.day >= 1 &&
                d.day <= month_length(d.year, d.month),
            "date_task: " + std::to_string(d.year) + "-" + std::to_string(d.month) + "-" +
                std::to_string(d.day) + " is not a date from 1950 to 2049");
}

std::string two(int x) {  // 7 -> "07"
    char s[8];
    std::snprintf(s, sizeof s, "%02d", x);
    return s;
}

std::string ordinal(int day) {  // 1st 2nd 3rd 4th … 11th 12th 13th … 21st 22nd 23rd
    const char* suffix = "th";
    if (day / 10 != 1) {
        if (day % 10 == 1) suffix = "st";
        if (day % 10 == 2) suffix = "nd";
        if (day % 10 == 3) suffix = "rd";
    }
    return std::to_string(day) + suffix;
}

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string upper(std::string s) {
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
}

}  // namespace

std::string iso_date(const Date& d) {
    check(d);
    return std::to_string(d.year) + "-" + two(d.month) + "-" + two(d.day);
}

int weekday(const Date& d) {
    check(d);
    // Sakamoto: 0 = Sunday for the Gregorian calendar; shifted to 0 = Monday
    static const int t[12] = {0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4};
    const int y = d.month < 3 ? d.year - 1 : d.year;
    const int sunday0 = (y + y / 4 - y / 100 + y / 400 + t[d.month - 1] + d.day) % 7;
    return (sunday0 + 6) % 7;
}

int day_number(const Date& d) {
    check(d);
    int n = 0;
    for (int y = 1950; y < d.year; ++y) n += leap(y) ? 366 : 365;
    for (int m = 1; m < d.month; ++m) n += month_length(d.year, m);
    return n + d.day - 1;
}

bool held_out(const Date& d) { return day_number(d) % 5 == 0; }

Date random_date(Rng& rng, bool from_held_out) {
    for (;;) {  // one draw in five lands in the held-out set: a few tries at most
        Date d;
        d.year = 1950 + static_cast<int>(rng.below(100));
        d.month = 1 + static_cast<int>(rng.below(12));
        d.day = 1 + static_cast<int>(rng.below(static_cast<std::uint64_t>(month_length(d.year, d.month))));
        if (held_out(d) == from_held_out) return d;
    }
}

std::string date_text(const Date& d, int format) {
    check(d);
    const std::string month = month_names[d.month - 1];
    const std::string abbr = month.substr(0, 3);
    const std::string day = std::to_string(d.day), year = std::to_string(d.year);
    const std::string yy = two(d.year % 100);
    switch (format) {
        case 0: return day + " " + month + " " + year;
        case 1: return month + " " + day + ", " + year;
        case 2: return abbr + " " + day + ", " + yy;
        case 3: return two(d.day) + "/" + two(d.month) + "/" + year;
        case 4: return two(d.day) + "." + two(d.month) + "." + yy;
        case 5: return year + "/" + two(d.month) + "/" + two(d.day);
        case 6: return day + " " + lower(abbr) + " " + year;
        case 7: return std::string(weekday_names[weekday(d)]) + ", " + day + " " + month + " " + year;
        case 8: return "the " + ordinal(d.day) + " of " + month + ", " + year;
        case 9: return two(d.day) + "-" + upper(abbr) + "-" + year;
        default: break;
    }
    throw std::invalid_argument("date_text: format " + std::to_string(format) + " is outside [0, " +
                                std::to_string(date_format_count) + ")");
}

std::string date_characters() {
    // every month and weekday name in every format, and every digit: the characters of all
    // the texts the task can produce
    std::string all = "0123456789-";
    for (int m = 1; m <= 12; ++m)
        for (int day = 1; day <= 7; ++day)  // seven consecutive days: every weekday
            for (int f = 0; f < date_format_count; ++f) all += date_text(Date{2026, m, day}, f);
    return CharVocab::from_text(all).chars();
}

}  // namespace attn
