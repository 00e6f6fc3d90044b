#include "attn/fixtures.hpp"
#include "attn/check.hpp"
#include "attn/npy.hpp"
#include "scratch.hpp"

#include <doctest/doctest.h>

#include <filesystem>

using namespace attn;

namespace {
const std::filesystem::path fixtures = attn::fixtures_dir() / "library";
}

TEST_CASE("float32 files written by NumPy load with their shape and values") {
    Tensor2 t = load_npy<2>(fixtures / "f4_2x3.npy");
    Tensor2 expected = {{0.0f, 0.25f, 0.5f}, {0.75f, 1.0f, 1.25f}};
    CHECK_CLOSE(t, expected, 0.0);
}

TEST_CASE("float64, bool and int64 files are converted to float32") {
    CHECK_CLOSE(load_npy<1>(fixtures / "f8_3.npy"), Tensor1({0.5f, -1.25f, 3.0f}), 0.0);
    CHECK_CLOSE(load_npy<2>(fixtures / "b1_2x2.npy"), Tensor2({{1, 0}, {0, 1}}), 0.0);
    CHECK_CLOSE(load_npy<1>(fixtures / "i8_4.npy"), Tensor1({3, 1, 4, 1}), 0.0);
    NpyArray scalar = read_npy(fixtures / "f4_scalar.npy");
    CHECK(scalar.shape.empty());
    CHECK(scalar.data == std::vector<float>{2.5f});
}

TEST_CASE("a saved tensor loads back bit for bit") {
    const auto path = attn_test::scratch("attn_test_roundtrip.npy");
    Tensor3 t = {{{1.5f, -2.0f}, {3.25f, 1e-8f}}, {{0.0f, -0.0f}, {1e30f, 7.0f}}};
    save_npy(path, t);
    Tensor3 back = load_npy<3>(path);
    CHECK_CLOSE(back, t, 0.0);
    std::filesystem::remove(path);
}

TEST_CASE("bad files give one clear error naming the file") {
    SUBCASE("missing") {
        CHECK_THROWS_WITH_AS(read_npy(fixtures / "absent.npy"),
                             doctest::Contains("absent.npy: no such file"), NpyError);
    }
    SUBCASE("not a .npy file") {
        CHECK_THROWS_WITH_AS(read_npy(fixtures / "not_npy.npy"),
                             doctest::Contains("bad magic bytes"), NpyError);
    }
    SUBCASE("truncated") {
        CHECK_THROWS_WITH_AS(read_npy(fixtures / "truncated.npy"),
                             doctest::Contains("truncated"), NpyError);
    }
    SUBCASE("Fortran order") {
        CHECK_THROWS_WITH_AS(read_npy(fixtures / "fortran.npy"),
                             doctest::Contains("Fortran-order"), NpyError);
    }
    SUBCASE("unsupported dtype") {
        CHECK_THROWS_WITH_AS(read_npy(fixtures / "complex.npy"),
                             doctest::Contains("unsupported dtype '<c8'"), NpyError);
    }
    SUBCASE("wrong rank") {
        CHECK_THROWS_WITH_AS(load_npy<3>(fixtures / "f4_2x3.npy"),
                             doctest::Contains("expected a 3-d array, the file holds shape (2, 3)"),
                             NpyError);
    }
}
