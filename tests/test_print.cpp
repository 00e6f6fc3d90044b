#include "attn/print.hpp"

#include <doctest/doctest.h>

using namespace attn;

TEST_CASE("short tensors print every value with fixed precision") {
    CHECK(format_tensor(Tensor1({1.0f, -0.5f, 0.25f})) == "[  1.0000, -0.5000,  0.2500]");
    CHECK(format_tensor(Tensor2({{1, 2}, {3, 4}}), {2}) == "[  1.00,  2.00]\n[  3.00,  4.00]\n");
}

TEST_CASE("long axes are summarised with their edge items") {
    Tensor1 t = xt::arange<float>(10.0f);
    PrintOptions o;
    o.precision = 1;
    o.edge_items = 2;
    CHECK(format_tensor(t, o) == "[  0.0,  1.0,  ...,  8.0,  9.0]");
}
