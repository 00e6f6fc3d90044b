#include "attn/check.hpp"
#include "attn/tensor.hpp"

#include <doctest/doctest.h>

using namespace attn;

TEST_CASE("shapes print the way PyTorch prints them") {
    CHECK(format_shape({4, 8, 32}) == "(4, 8, 32)");
    CHECK(format_shape({5}) == "(5,)");
    CHECK(format_shape({}) == "()");
}

TEST_CASE("expect_shape accepts the right shape and names both shapes otherwise") {
    Tensor3 x = xt::zeros<float>({4, 8, 32});
    CHECK_NOTHROW(expect_shape("x", x, {4, 8, 32}));
    CHECK_NOTHROW(expect_shape("x", x, {any, 8, any}));
    CHECK_THROWS_WITH_AS(expect_shape("x", x, {4, 8, 16}),
                         "x: expected shape (4, 8, 16), got (4, 8, 32)", std::invalid_argument);
    CHECK_THROWS_WITH_AS(expect_shape("x", x, {any, 8}), "x: expected shape (*, 8), got (4, 8, 32)",
                         std::invalid_argument);
}

TEST_CASE("the tensor comparison reports the worst element") {
    Tensor2 a = {{1.0f, 2.0f}, {3.0f, 4.0f}};
    Tensor2 b = {{1.0f, 2.0f}, {3.0f, 4.5f}};
    auto c = check::compare(a, b, 1e-6);
    CHECK_FALSE(c.ok);
    CHECK(c.max_abs_diff == doctest::Approx(0.5));
    CHECK(c.report.find("[1, 1]") != std::string::npos);
    CHECK(check::compare(a, a, 0.0).ok);
    Tensor2 wrong_shape = xt::zeros<float>({2, 3});
    CHECK_FALSE(check::compare(a, wrong_shape, 1.0).ok);
}
