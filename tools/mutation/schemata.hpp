// The switches of a mutant schema (tools/mutation/mutate.py): every generated mutant of a
// solution is compiled into one program, each guarded by its number, and the environment
// variable ATTN_MUTANT picks the one that is active (none when it is unset or 0). A mutated
// operator becomes a call here that applies the original operator or its replacement;
// `on(id)` guards every other kind of mutant. Only operators on built-in types are mutated
// this way (the generator reads the types from clang's syntax tree), so both branches of
// every call have the type the original expression had.
//
// Force-included (-include) into the generated source, so that its lines stay the solution's.
#pragma once

#include <cstdint>
#include <cstdlib>

namespace attn_mutant {

/// The active mutant's number, read once (thread-safe: the simulated GPU's threads ask too).
inline long active() {
    static const long id = [] {
        const char* s = std::getenv("ATTN_MUTANT");
        return s == nullptr ? 0L : std::strtol(s, nullptr, 10);
    }();
    return id;
}

/// Whether mutant `id` is the active one.
inline bool on(long id) { return active() == id; }

// A binary operator and its replacement: op(id, x, y) is `x op y`, or `x alt y` when mutant
// `id` is active. Operands are taken by value: they are built-in arithmetic or pointer values.
#define ATTN_MUTANT_BINARY(name, op, alt)                                        \
    template <class X, class Y>                                                  \
    inline auto name(long id, X x, Y y)->decltype(x op y) {                      \
        if (on(id)) return static_cast<decltype(x op y)>(x alt y);               \
        return x op y;                                                           \
    }
ATTN_MUTANT_BINARY(lt, <, <=)
ATTN_MUTANT_BINARY(le, <=, <)
ATTN_MUTANT_BINARY(gt, >, >=)
ATTN_MUTANT_BINARY(ge, >=, >)
ATTN_MUTANT_BINARY(add, +, -)
ATTN_MUTANT_BINARY(sub, -, +)
ATTN_MUTANT_BINARY(mul, *, /)
ATTN_MUTANT_BINARY(div, /, *)
#undef ATTN_MUTANT_BINARY

// A compound assignment and its replacement: `x op= y`, or `x alt= y` when `id` is active.
#define ATTN_MUTANT_ASSIGN(name, op, alt)        \
    template <class X, class Y>                  \
    inline X& name(long id, X& x, Y y) {         \
        if (on(id))                              \
            x alt y;                             \
        else                                     \
            x op y;                              \
        return x;                                \
    }
ATTN_MUTANT_ASSIGN(add_assign, +=, -=)
ATTN_MUTANT_ASSIGN(sub_assign, -=, +=)
ATTN_MUTANT_ASSIGN(mul_assign, *=, /=)
ATTN_MUTANT_ASSIGN(div_assign, /=, *=)
#undef ATTN_MUTANT_ASSIGN

/// A float64 value as a float variable would hold it, when `id` is active: every value stored
/// in a `double` rounded to float, which is what declaring it `float` does (for +, −, ×, ÷ and
/// conversions, rounding the double result again to float gives float's own result).
template <class X>
inline X narrow_float(long id, X x) {
    return on(id) ? static_cast<X>(static_cast<float>(x)) : x;
}

/// A 64-bit integer as an `int` variable would hold it, when `id` is active.
template <class X>
inline X narrow_32(long id, X x) {
    return on(id) ? static_cast<X>(static_cast<std::int32_t>(x)) : x;
}

/// `n`, or `n − 1` when `id` is active (a loop's bound off by one).
template <class X>
inline X minus_one(long id, X n) {
    return on(id) ? static_cast<X>(n - 1) : n;
}

}  // namespace attn_mutant
