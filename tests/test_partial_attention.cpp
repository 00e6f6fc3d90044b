// Partial attentions merged by their log-sum-exps, the sequence splits of lesson 19, and the
// model's hooks for data parallelism (gradient buckets, the batch offset of its dropout).
#include "attn/check.hpp"
#include "attn/gpt.hpp"
#include "attn/partial_attention.hpp"
#include "attn/random.hpp"
#include "attn/threads.hpp"
#include "attn/trainer.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace attn;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

// Attention of query rows over a subset of the keys, in float64 by its definition:
// lse = ln Σ_{j∈keys} e^{s_j}, out = Σ_{j∈keys} e^{s_j − lse} v_j, s_j = q·k_j/√hs.
struct Partial64 {
    std::vector<double> out, lse;  // (rows, hs), (rows)
};
Partial64 attend64(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                   std::size_t rows, std::size_t hs, const std::vector<std::size_t>& keys) {
    Partial64 p{std::vector<double>(rows * hs, 0.0), std::vector<double>(rows, -INFINITY)};
    for (std::size_t i = 0; i < rows; ++i) {
        std::vector<double> s;
        for (std::size_t j : keys) {
            double dot = 0.0;
            for (std::size_t d = 0; d < hs; ++d) dot += static_cast<double>(q[i * hs + d]) * k[j * hs + d];
            s.push_back(dot / std::sqrt(static_cast<double>(hs)));
        }
        if (s.empty()) continue;
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0.0;
        for (double x : s) sum += std::exp(x - m);
        p.lse[i] = m + std::log(sum);
        for (std::size_t n = 0; n < keys.size(); ++n) {
            const double w = std::exp(s[n] - p.lse[i]);
            for (std::size_t d = 0; d < hs; ++d) p.out[i * hs + d] += w * v[keys[n] * hs + d];
        }
    }
    return p;
}

std::vector<float> to_float(const std::vector<double>& x) { return {x.begin(), x.end()}; }

std::vector<float> normal(Rng& rng, std::size_t n, float scale = 1.0f) {
    std::vector<float> x(n);
    for (float& e : x) e = scale * rng.normal();
    return x;
}

double max_gap(const std::vector<float>& a, const std::vector<double>& b) {
    double gap = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        gap = std::max(gap, std::isnan(a[i]) ? INFINITY : std::fabs(a[i] - b[i]));
    }
    return gap;
}

// The model of the bucket tests: three blocks of 13 tokens, dropout on.
GPTConfig bucket_model(bool bias, Position position) {
    GPTConfig config;
    config.vocab_size = 13;
    config.block_size = 8;
    config.n_layer = 3;
    config.n_head = 2;
    config.n_embd = 16;
    config.dropout = 0.1f;
    config.bias = bias;
    config.position = position;
    return config;
}

// n random inputs and targets of bucket_model()'s vocabulary.
void random_batch(std::uint64_t seed, int n, std::vector<int>& x, std::vector<int>& y) {
    Rng rng(seed);
    x.resize(static_cast<std::size_t>(n));
    y.resize(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
        x[static_cast<std::size_t>(i)] = static_cast<int>(rng.below(13));
        y[static_cast<std::size_t>(i)] = static_cast<int>(rng.below(13));
    }
}

}  // namespace

TEST_CASE("merging the partial attentions over two disjoint sets of keys gives attention over their union") {
    Rng rng(19);
    const std::size_t rows = 6, keys = 40, hs = 8;
    const std::vector<float> q = normal(rng, rows * hs, 2.0f), k = normal(rng, keys * hs),
                             v = normal(rng, keys * hs);
    for (int split = 0; split < 4; ++split) {
        CAPTURE(split);
        // Deal the keys out at random: any two disjoint sets, not only halves.
        std::vector<std::size_t> a, b, all(keys);
        std::iota(all.begin(), all.end(), 0);
        for (std::size_t j = 0; j < keys; ++j) (rng.below(3) == 0 ? a : b).push_back(j);
        const Partial64 pa = attend64(q, k, v, rows, hs, a), pb = attend64(q, k, v, rows, hs, b),
                        whole = attend64(q, k, v, rows, hs, all);
        std::vector<float> out = to_float(pa.out), lse = to_float(pa.lse);
        merge_partial_attention(out.data(), lse.data(), to_float(pb.out).data(), to_float(pb.lse).data(),
                                rows, hs);
        // Against float64: inputs rounded to float32 (|out| ≤ 3, lse < 16: ½ulp ≤ 2^-21 ≈ 4.8e-7)
        // and ~5 float operations (u = 2^-24). out = w_a o_a + w_b o_b, w_a = σ(lse_a − lse_b),
        // σ' ≤ 1/4: the lse roundings move w by ≤ ¼·2·4.8e-7 = 2.4e-7, out by that × |o_a − o_b|
        // ≤ 6, 1.4e-6; with u|o| for o's rounding and ~5u|o| for the arithmetic, ≤ 2.5e-6 at
        // these extremes together, ~1e-6 at the fixture's lse ≈ 4..8 and |o_a − o_b| ≲ 2: 2e-6
        // rests on those sizes. lse = m + ln(a + b): w_a δa + w_b δb ≤ 4.8e-7, ½ulp of the sum
        // 4.8e-7 and ln's ~2u: ≤ 1.2e-6, 3× below 4e-6. A wrong merge is off by O(1) (ln 2).
        CHECK(max_gap(out, whole.out) < 2e-6);
        CHECK(max_gap(lse, whole.lse) < 4e-6);
    }
}

TEST_CASE("the merge by hand: lse ln 2 and ln 6 give ln 8, and weights 1/4 and 3/4") {
    // Side a: keys whose e^s sum to 2, output [1, 0]; side b: sum 6, output [0, 1].
    std::vector<float> out = {1.0f, 0.0f}, lse = {std::log(2.0f)};
    const std::vector<float> out_b = {0.0f, 1.0f}, lse_b = {std::log(6.0f)};
    merge_partial_attention(out.data(), lse.data(), out_b.data(), lse_b.data(), 1, 2);
    // Approx(x).epsilon(e) allows e·(1 + |x|): 3.1e-6 on ln 8 ≈ 2.08, 1.3e-6 and 1.8e-6 on
    // the weights. ln 2, ln 6 rounded (u|lse| ≤ 1.1e-7), exp, sum, ln, add: ≲ 6u·2.1 ≈ 7.5e-7;
    // the weights, ~4 roundings of size ≤ 0.75 plus σ' = 3/16 of the lse roundings: ≲ 2.2e-7.
    CHECK(lse[0] == doctest::Approx(std::log(8.0)).epsilon(1e-6));
    CHECK(out[0] == doctest::Approx(0.25).epsilon(1e-6));
    CHECK(out[1] == doctest::Approx(0.75).epsilon(1e-6));
}

TEST_CASE("a side that saw no key (lse −∞) changes nothing, and two such sides stay empty") {
    std::vector<float> out = {0.0f, 0.0f, 3.0f, 4.0f}, lse = {-inf, 1.5f};
    const std::vector<float> out_b = {5.0f, 6.0f, 0.0f, 0.0f}, lse_b = {0.25f, -inf};
    merge_partial_attention(out.data(), lse.data(), out_b.data(), lse_b.data(), 2, 2);
    // Exact: e^(−∞ − m) = 0 and e^0 = 1, so (1·o + 0·o_b)/1 and m + ln 1 round nothing.
    CHECK(out == std::vector<float>{5.0f, 6.0f, 3.0f, 4.0f});
    CHECK(lse == std::vector<float>{0.25f, 1.5f});
    std::vector<float> empty = {0.0f, 0.0f}, none = {-inf};
    const std::vector<float> empty_b = {0.0f, 0.0f}, none_b = {-inf};
    merge_partial_attention(empty.data(), none.data(), empty_b.data(), none_b.data(), 1, 2);
    CHECK(empty == std::vector<float>{0.0f, 0.0f});
    CHECK(none[0] == -inf);
}

TEST_CASE("log-sum-exps of ±1000 merge without overflow or underflow") {
    // e^1000 overflows float; ln(e^1000 + e^999) = 1000 + ln(1 + e^-1).
    std::vector<float> out = {1.0f}, lse = {1000.0f};
    const std::vector<float> out_b = {0.0f}, lse_b = {999.0f};
    merge_partial_attention(out.data(), lse.data(), out_b.data(), lse_b.data(), 1, 1);
    // epsilon(1e-7) on |lse| ≈ 1000 allows 1e-7·(1 + 1000.3) ≈ 1.0e-4; the float result has
    // ½ulp(1000) = 2^-15 ≈ 3.1e-5 from its last addition (1000 − 999 is exact, ln(1 + e^-1)
    // ~2u): 3× below. The weight 0.731, ~4 roundings ≲ 4u·0.73 ≈ 1.7e-7, under 1e-6·1.73.
    // Without the max subtracted, e^1000 is inf and both are NaN.
    CHECK(lse[0] == doctest::Approx(1000.0 + std::log1p(std::exp(-1.0))).epsilon(1e-7));
    CHECK(out[0] == doctest::Approx(1.0 / (1.0 + std::exp(-1.0))).epsilon(1e-6));
    std::vector<float> small = {1.0f}, small_lse = {-1000.0f};
    const std::vector<float> small_b = {0.0f}, small_lse_b = {-1001.0f};
    merge_partial_attention(small.data(), small_lse.data(), small_b.data(), small_lse_b.data(), 1, 1);
    CHECK(small_lse[0] == doctest::Approx(-1000.0 + std::log1p(std::exp(-1.0))).epsilon(1e-7));
    CHECK(small[0] == doctest::Approx(1.0 / (1.0 + std::exp(-1.0))).epsilon(1e-6));
}

TEST_CASE("zigzag gives rank r pieces r and 2N − 1 − r, and contiguous gives piece r") {
    const SequenceSplit zigzag{64, 4, SequenceOrder::zigzag}, contiguous{64, 4, SequenceOrder::contiguous};
    CHECK(zigzag.pieces() == 8);
    CHECK(zigzag.piece_length() == 8);
    CHECK(zigzag.local_length() == 16);
    CHECK(zigzag.pieces_of(0) == std::vector<std::size_t>{0, 7});
    CHECK(zigzag.pieces_of(3) == std::vector<std::size_t>{3, 4});
    CHECK(contiguous.pieces_of(2) == std::vector<std::size_t>{2});
    CHECK_THROWS_AS(SequenceSplit({60, 4, SequenceOrder::zigzag}).validate(), std::invalid_argument);
    CHECK_THROWS_AS(SequenceSplit({0, 2, SequenceOrder::contiguous}).validate(), std::invalid_argument);
    CHECK_THROWS_AS(SequenceSplit({8, 0, SequenceOrder::contiguous}).validate(), std::invalid_argument);
    CHECK_THROWS_AS((void)zigzag.pieces_of(4), std::invalid_argument);
}

TEST_CASE("every position goes to one rank, and back to its place") {
    const std::size_t B = 2, NH = 3, T = 24, width = 5;
    std::vector<float> whole(B * NH * T * width);
    std::iota(whole.begin(), whole.end(), 0.0f);
    for (SequenceOrder order : {SequenceOrder::contiguous, SequenceOrder::zigzag}) {
        for (std::size_t N : {1u, 2u, 3u}) {
            CAPTURE(N);
            const SequenceSplit split{T, N, order};
            std::vector<float> back(whole.size(), -1.0f);
            std::multiset<float> seen;
            for (std::size_t r = 0; r < N; ++r) {
                std::vector<float> local(whole.size() / N);
                take_local_pieces(local.data(), whole.data(), split, r, B, NH, width);
                seen.insert(local.begin(), local.end());
                // The rank's first piece, batch 0, head 0, starts at its first position.
                CHECK(local[0] == whole[split.pieces_of(r)[0] * split.piece_length() * width]);
                put_local_pieces(back.data(), local.data(), split, r, B, NH, width);
            }
            CHECK(back == whole);
            CHECK(seen == std::multiset<float>(whole.begin(), whole.end()));
        }
    }
}

TEST_CASE("causal blocks: below the diagonal full, on it masked inside, above it skipped") {
    CHECK(block_mask(3, 1, true) == BlockMask::full);
    CHECK(block_mask(2, 2, true) == BlockMask::diagonal);
    CHECK(block_mask(1, 3, true) == BlockMask::skipped);
    CHECK(block_mask(1, 3, false) == BlockMask::full);
    CHECK(block_mask(2, 2, false) == BlockMask::full);
}

TEST_CASE("the ranks' pairs add up to the causal triangle, and zigzag shares them equally, contiguous does not") {
    const std::size_t T = 64;
    for (std::size_t N : {2u, 4u}) {
        CAPTURE(N);
        for (SequenceOrder order : {SequenceOrder::contiguous, SequenceOrder::zigzag}) {
            const SequenceSplit split{T, N, order};
            std::size_t total = 0, most = 0, least = T * T;
            for (std::size_t r = 0; r < N; ++r) {
                const std::size_t pairs = attention_pairs(split, r, true);
                total += pairs;
                most = std::max(most, pairs);
                least = std::min(least, pairs);
                CHECK(attention_pairs(split, r, false) == T * T / N);
            }
            CHECK(total == T * (T + 1) / 2);  // every visible (query, key) pair once
            if (order == SequenceOrder::zigzag) CHECK(most == least);
        }
        // Contiguous: rank r computes r full blocks and one diagonal: the last rank's
        // (N − 1)·c² + c(c + 1)/2 against the first rank's c(c + 1)/2.
        const std::size_t c = T / N;
        CHECK(attention_pairs({T, N, SequenceOrder::contiguous}, N - 1, true) == (N - 1) * c * c + c * (c + 1) / 2);
        CHECK(attention_pairs({T, N, SequenceOrder::contiguous}, 0, true) == c * (c + 1) / 2);
    }
}

TEST_CASE("a batch is shared in consecutive parts that differ by at most one sequence") {
    for (int B : {1, 7, 8, 12}) {
        for (int N = 1; N <= B; ++N) {
            int next = 0, smallest = B, largest = 0;
            for (int r = 0; r < N; ++r) {
                const auto [b0, b1] = batch_share(B, r, N);
                CHECK(b0 == next);
                next = b1;
                smallest = std::min(smallest, b1 - b0);
                largest = std::max(largest, b1 - b0);
            }
            CHECK(next == B);
            CHECK(largest - smallest <= 1);
        }
    }
    CHECK_THROWS_AS(batch_share(8, 2, 2), std::invalid_argument);
    CHECK_THROWS_AS(batch_share(8, 0, 0), std::invalid_argument);
}

TEST_CASE("the gradient buckets hold every parameter once, in the order the backward pass finishes them") {
    GPTConfig config;
    config.vocab_size = 11;
    config.block_size = 8;
    config.n_layer = 3;
    config.n_head = 2;
    config.n_embd = 16;
    config.bias = true;
    const GPT model(config, 3);
    const std::vector<GradientBucket>& buckets = model.gradient_buckets();
    REQUIRE(buckets.size() == 4);
    CHECK(buckets[0].name == "transformer.h.2");
    CHECK(buckets[2].name == "transformer.h.0");
    std::vector<int> owner(model.parameters().size(), 0);
    for (const GradientBucket& b : buckets) {
        std::size_t size = 0;
        for (const auto& [offset, n] : b.ranges) {
            for (std::size_t i = offset; i < offset + n; ++i) ++owner[i];
            size += n;
        }
        CHECK(size == b.size);
    }
    CHECK(std::all_of(owner.begin(), owner.end(), [](int n) { return n == 1; }));
}

TEST_CASE("the gradient hook hears each bucket once it is final, and changes no gradient's bits") {
    const GPTConfig config = bucket_model(true, Position::learned);
    const int B = 5, T = 8;
    std::vector<int> x, y;
    random_batch(4, B * T, x, y);
    const int threads = num_threads();
    for (int n : {1, 2, 3}) {
        CAPTURE(n);
        set_num_threads(n, "test");
        GPT plain(config, 9), hooked(config, 9);
        plain.seed_dropout(5);
        hooked.seed_dropout(5);
        plain.forward(x, y, B, T);
        hooked.forward(x, y, B, T);
        plain.zero_grad();
        plain.backward();
        std::vector<int> order;
        std::vector<std::vector<float>> seen(hooked.gradient_buckets().size());
        hooked.set_gradient_ready_hook([&](int b) {
            order.push_back(b);
            for (const auto& [offset, size] : hooked.gradient_buckets()[static_cast<std::size_t>(b)].ranges) {
                seen[static_cast<std::size_t>(b)].insert(seen[static_cast<std::size_t>(b)].end(),
                                                          hooked.gradients().begin() + static_cast<std::ptrdiff_t>(offset),
                                                          hooked.gradients().begin() + static_cast<std::ptrdiff_t>(offset + size));
            }
        });
        hooked.zero_grad();
        hooked.backward();
        CHECK(order == std::vector<int>{0, 1, 2, 3});
        CHECK(hooked.gradients() == plain.gradients());  // bit for bit
        // What the hook saw was already the final gradient.
        for (std::size_t b = 0; b < seen.size(); ++b) {
            std::vector<float> final_values;
            for (const auto& [offset, size] : hooked.gradient_buckets()[b].ranges) {
                final_values.insert(final_values.end(), hooked.gradients().begin() + static_cast<std::ptrdiff_t>(offset),
                                    hooked.gradients().begin() + static_cast<std::ptrdiff_t>(offset + size));
            }
            CHECK(seen[b] == final_values);
        }
        // And a removed hook is not called.
        hooked.set_gradient_ready_hook({});
        order.clear();
        hooked.backward();
        CHECK(order.empty());
    }
    set_num_threads(threads, "test");
}

TEST_CASE("the gradient sink gets every bucket's gradients bit for bit, keeping one block's buffer per thread") {
    const int B = 5, T = 8;
    Rng rng(4);
    std::vector<int> x(B * T), y(B * T);
    for (int i = 0; i < B * T; ++i) {
        x[i] = static_cast<int>(rng.below(13));
        y[i] = static_cast<int>(rng.below(13));
    }
    const int threads = num_threads();
    for (const bool bias : {true, false}) {
        for (const Position position : {Position::learned, Position::rope}) {
            const GPTConfig config = bucket_model(bias, position);
            for (int n : {1, 2, 3}) {
                CAPTURE(bias);
                const std::string where = position_name(position);
                CAPTURE(where);
                CAPTURE(n);
                set_num_threads(n, "test");
                GPT plain(config, 9), sunk(config, 9);
                std::vector<float> gathered(plain.parameters().size(), -1.0f);
                std::vector<int> order;
                sunk.set_gradient_sink([&](int b, float* g) {
                    order.push_back(b);
                    for (const auto& [offset, size] : sunk.gradient_buckets()[static_cast<std::size_t>(b)].ranges) {
                        std::copy(g, g + size, gathered.begin() + static_cast<std::ptrdiff_t>(offset));
                        g += size;
                    }
                });
                CHECK(sunk.gradients().empty());
                CHECK_THROWS_AS(sunk.set_gradient_ready_hook([](int) {}), std::invalid_argument);
                for (int step = 0; step < 2; ++step) {  // the buffers are cleared between passes
                    plain.seed_dropout(5 + step);
                    sunk.seed_dropout(5 + step);
                    plain.forward(x, y, B, T);
                    sunk.forward(x, y, B, T);
                    plain.zero_grad();
                    plain.backward();
                    order.clear();
                    sunk.zero_grad();
                    sunk.backward();
                    CHECK(order == std::vector<int>{0, 1, 2, 3});
                    CHECK(gathered == plain.gradients());  // bit for bit, every parameter
                }
                // What it holds: one block's gradients and the embeddings' and ln_f's, per slice.
                const std::size_t block = sunk.gradient_buckets()[0].size, rest = sunk.gradient_buckets()[3].size;
                const auto slices = static_cast<std::size_t>(std::min(B, n));
                CHECK(sunk.memory_use().gradients == slices * (block + rest) * sizeof(float));
                // against a whole buffer per slice: (block + rest) against 3 blocks + rest
                CHECK(plain.memory_use().gradients == slices * plain.parameters().size() * sizeof(float));
                // Without the sink the whole buffer is back, zeroed, and backward() fills it.
                sunk.set_gradient_sink({});
                CHECK(sunk.gradients().size() == plain.gradients().size());
                CHECK(std::all_of(sunk.gradients().begin(), sunk.gradients().end(), [](float g) { return g == 0.0f; }));
                sunk.seed_dropout(6);
                sunk.forward(x, y, B, T);
                sunk.backward();
                CHECK(sunk.gradients() == plain.gradients());
            }
        }
    }
    set_num_threads(threads, "test");
}

// A weight source for GPT::set_weight_source that hands out each bucket of a copy of the
// weights, as a gather would, and writes down what it was asked: "s<b>" for start, "w<b>" for
// wait. Filled by start() itself, or (background) by a thread of its own after a pause, as ZeRO
// stage 3's communication thread fills it, so that a pass that reads a buffer before waiting
// for it, or refills one still in use, reads other weights.
struct RecordingSource {
    const GPT* model = nullptr;
    std::vector<float> weights;
    std::vector<std::string> asked;
    std::deque<std::thread> filling;  // background: one thread per bucket started, oldest first

    void fill(int b, float* w) const {
        for (const auto& [offset, size] : model->gradient_buckets()[static_cast<std::size_t>(b)].ranges) {
            std::copy(weights.begin() + static_cast<std::ptrdiff_t>(offset),
                      weights.begin() + static_cast<std::ptrdiff_t>(offset + size), w);
            w += size;
        }
    }
    WeightSource source(bool background) {
        WeightSource s;
        s.start = [this, background](int b, float* w) {
            asked.push_back("s" + std::to_string(b));
            if (!background) return fill(b, w);
            filling.emplace_back([this, b, w] {
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
                fill(b, w);
            });
        };
        if (background) {
            s.wait = [this](int b) {
                asked.push_back("w" + std::to_string(b));
                filling.front().join();
                filling.pop_front();
            };
        }
        return s;
    }
};

// The start and wait calls a pass makes, `order` the buckets it asks for: the first two
// started together, then each waited for as the next is started.
std::vector<std::string> prefetched(const std::vector<int>& order, bool background) {
    std::vector<std::string> calls;
    const auto s = [&](std::size_t i) { calls.push_back("s" + std::to_string(order[i])); };
    const auto w = [&](std::size_t i) {
        if (background) calls.push_back("w" + std::to_string(order[i]));
    };
    s(0);
    s(1);
    w(0);
    for (std::size_t i = 1; i < order.size(); ++i) {
        w(i);
        if (i + 1 < order.size()) s(i + 1);
    }
    return calls;
}

TEST_CASE("a weight source gives the passes every block's weights: the same loss and gradients, bit for bit") {
    const int B = 5, T = 8;
    std::vector<int> x, y;
    random_batch(7, B * T, x, y);
    const int threads = num_threads();
    for (const bool background : {false, true}) {
        for (const bool bias : {true, false}) {
            for (const Position position : {Position::learned, Position::rope}) {
                const GPTConfig config = bucket_model(bias, position);
                for (int n : {1, 2, 3}) {
                    CAPTURE(background);
                    CAPTURE(bias);
                    const std::string where = position_name(position);
                    CAPTURE(where);
                    CAPTURE(n);
                    set_num_threads(n, "test");
                    GPT plain(config, 9), sourced(config, 9);
                    RecordingSource recorder;
                    recorder.model = &sourced;
                    recorder.weights = sourced.parameters();
                    const std::vector<float>& weights = recorder.weights;
                    std::vector<std::string>& asked = recorder.asked;
                    std::vector<float> gathered(weights.size(), -1.0f);
                    sourced.set_gradient_sink([&](int b, float* g) {
                        for (const auto& [offset, size] : sourced.gradient_buckets()[static_cast<std::size_t>(b)].ranges) {
                            std::copy(g, g + size, gathered.begin() + static_cast<std::ptrdiff_t>(offset));
                            g += size;
                        }
                    });
                    sourced.set_weight_source(recorder.source(background));
                    CHECK(sourced.parameters().empty());
                    CHECK(sourced.params().qkvw == nullptr);
                    for (int step = 0; step < 2; ++step) {
                        plain.seed_dropout(5 + step);
                        sourced.seed_dropout(5 + step);
                        asked.clear();
                        const float loss = plain.forward(x, y, B, T);
                        CHECK(sourced.forward(x, y, B, T) == loss);
                        // the embeddings and ln_f first, then block 0, 1, 2 (buckets 2, 1, 0), each
                        // block's weights started as soon as the block before's have come
                        CHECK(asked == prefetched({3, 2, 1, 0}, background));
                        CHECK(sourced.logits() == plain.logits());
                        plain.zero_grad();
                        plain.backward();
                        asked.clear();
                        sourced.backward();
                        CHECK(asked == prefetched({3, 0, 1, 2}, background));  // then block 2, 1, 0
                        CHECK(gathered == plain.gradients());  // bit for bit, every parameter
                        CHECK(recorder.filling.empty());  // nothing left under way
                    }
                    // What it holds as weights: two blocks' (one computing, the next arriving) and
                    // the embeddings' and ln_f's.
                    const std::size_t block = sourced.gradient_buckets()[0].size, rest = sourced.gradient_buckets()[3].size;
                    CHECK(sourced.memory_use().weights == (2 * block + rest) * sizeof(float));
                    CHECK(plain.memory_use().weights == weights.size() * sizeof(float));
                    // Refused: another precision (it rounds a copy of the whole weights), and a
                    // backward pass with no sink to take its gradients.
                    sourced.set_precision(Precision::bf16);
                    CHECK_THROWS_WITH_AS(sourced.forward(x, y, B, T), doctest::Contains("float32 only"), std::invalid_argument);
                    sourced.set_precision(Precision::fp32);
                    sourced.set_gradient_sink({});
                    CHECK_THROWS_WITH_AS(sourced.backward(), doctest::Contains("needs a gradient sink"), std::invalid_argument);
                    CHECK(sourced.gather_parameters() == weights);
                    // Without the source the whole buffer is back, asked of the source bucket by bucket.
                    asked.clear();
                    sourced.set_weight_source({});
                    const std::vector<std::string> one_by_one =
                        background ? std::vector<std::string>{"s0", "w0", "s1", "w1", "s2", "w2", "s3", "w3"}
                                   : std::vector<std::string>{"s0", "s1", "s2", "s3"};
                    CHECK(asked == one_by_one);
                    CHECK(sourced.parameters() == weights);
                    CHECK(sourced.memory_use().weights == weights.size() * sizeof(float));
                    sourced.seed_dropout(6);
                    plain.seed_dropout(6);
                    CHECK(sourced.forward(x, y, B, T) == plain.forward(x, y, B, T));
                }
            }
        }
    }
    set_num_threads(threads, "test");
}

TEST_CASE("two halves of a batch with their offsets drop what the whole batch drops") {
    GPTConfig config;
    config.vocab_size = 13;
    config.block_size = 8;
    config.n_layer = 2;
    config.n_head = 2;
    config.n_embd = 16;
    config.dropout = 0.3f;
    const int B = 4, T = 8, half = B / 2;
    Rng rng(6);
    std::vector<int> x(B * T), y(B * T);
    for (int i = 0; i < B * T; ++i) {
        x[i] = static_cast<int>(rng.below(13));
        y[i] = static_cast<int>(rng.below(13));
    }
    GPT whole(config, 2), part(config, 2);
    whole.seed_dropout(8);
    whole.forward(x, y, B, T);
    const std::vector<float> losses = whole.activations().losses;  // (B, T) per position
    // The largest gap between a half's per-position losses and the whole batch's there. A
    // product over fewer rows may be summed in another order (OpenBLAS's blocking, the
    // threads' split of the rows). Each of the 6L + 1 = 13 products (n ≤ 4C = 64) differs by
    // ≤ 2γ_64 ≈ 7.6e-6 of Σ|terms| (u = 2^-24); carried to the logits (Σ_c |lnf_c wte_vc| ≤
    // √C·0.02·√C = 0.32 at N(0, 0.02) weights) and |Δloss| ≤ 2 max|Δlogit|: ≤ 13·2·7.6e-6·0.32
    // ≈ 6e-5 worst case; with random signs √13·√64·u·0.32·2 ≈ 1.1e-6. 1e-5 rests on the
    // latter, 9× above it. Other dropout masks change a position's loss (~2.6) by ~1e-1.
    auto gap = [&](int offset) {
        double worst = 0.0;
        const std::vector<float>& mine = part.activations().losses;
        for (std::size_t i = 0; i < mine.size(); ++i) {
            worst = std::max(worst, std::fabs(static_cast<double>(mine[i]) - losses[offset * T + i]));
        }
        return worst;
    };
    for (int offset : {0, half}) {
        CAPTURE(offset);
        part.seed_dropout(8);
        part.set_batch_offset(offset);
        part.forward(x.data() + offset * T, y.data() + offset * T, half, T);
        CHECK(gap(offset) < 1e-5);
    }
    // Without the offset the second half draws the first half's masks: other losses.
    part.seed_dropout(8);
    part.set_batch_offset(0);
    part.forward(x.data() + half * T, y.data() + half * T, half, T);
    CHECK(gap(half) > 1e-2);
    CHECK_THROWS_AS(part.set_batch_offset(-1), std::invalid_argument);
}
