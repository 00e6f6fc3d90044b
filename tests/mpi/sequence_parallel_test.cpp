// Ring attention and Ulysses attention over N ranks against single-process attention,
// forward and backward: the output, its log-sum-exp and dq, dk, dv equal one process's
// attention_fast_forward / attention_fast_backward on the whole sequence to float rounding,
// for T up to 16384, causal (zig-zag and contiguous orders) and not; at T = 512 every result
// is measured against float64 with FlashAttention's rule (at most twice the error of the
// plain float32 attention). The ring's buffers hold O(T/N · hs) floats per rank, and its
// resident memory grows by that order, never by a (T, T) matrix.
//
// `--merge added` runs the same checks (at T = 512) with a wrong merge that adds the
// log-sum-exps instead of combining them: they must fail (CTest checks that they do).
// `--quick` runs the cases of T = 512 only (the test across network namespaces).
//
// Run as `mpirun -np N sequence_parallel_test` (N = 2, 4; CTest does).
#include "mpi_test.hpp"

#include "attn/flash.hpp"
#include "attn/mpi/ring_attention.hpp"
#include "attn/mpi/ulysses.hpp"
#include "attn/mpi/world.hpp"
#include "attn/partial_attention.hpp"
#include "attn/random.hpp"

#include <string>
#include <vector>

using namespace attn;

namespace {

std::vector<float> normal(Rng& rng, std::size_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = rng.normal();
    return x;
}

// The whole problem, the same on every rank (drawn from one seed).
struct Problem {
    AttentionShape shape;
    std::vector<float> q, k, v, dout;
    Problem(const AttentionShape& s, std::uint64_t seed) : shape(s) {
        Rng rng(seed);
        q = normal(rng, s.qkv_size());
        k = normal(rng, s.qkv_size());
        v = normal(rng, s.qkv_size());
        dout = normal(rng, s.qkv_size());
    }
};

// Every rank's pieces (take_local_pieces' layout) put together into the whole tensor, on
// every rank.
std::vector<float> gather(const std::vector<float>& local, const SequenceSplit& split,
                          std::size_t B, std::size_t NH, std::size_t width) {
    std::vector<float> all(local.size() * split.ranks), whole(all.size());
    MPI_Allgather(local.data(), static_cast<int>(local.size()), MPI_FLOAT, all.data(),
                  static_cast<int>(local.size()), MPI_FLOAT, MPI_COMM_WORLD);
    for (std::size_t r = 0; r < split.ranks; ++r) {
        put_local_pieces(whole.data(), all.data() + r * local.size(), split, r, B, NH, width);
    }
    return whole;
}

std::vector<float> local_of(const std::vector<float>& whole, const SequenceSplit& split,
                            std::size_t rank, std::size_t B, std::size_t NH, std::size_t width) {
    std::vector<float> local(whole.size() / split.ranks);
    take_local_pieces(local.data(), whole.data(), split, rank, B, NH, width);
    return local;
}

// Single-process attention on the whole sequence, for the (batch, head) items i with
// i % N = rank: what the split versions must give there. The ranks share the reference's
// work (each item is a whole attention problem of its own).
struct Reference {
    std::vector<std::size_t> items;  // which (batch, head) items, b·NH + h
    std::vector<float> out, lse, dq, dk, dv;  // (items, T, hs) and (items, T)
};
Reference single_process(const Problem& p, std::size_t rank, std::size_t ranks) {
    Reference r;
    const std::size_t T = p.shape.T, hs = p.shape.hs, item = T * hs;
    for (std::size_t i = rank; i < p.shape.B * p.shape.NH; i += ranks) r.items.push_back(i);
    const std::size_t n = r.items.size();
    std::vector<float> q(n * item), k(n * item), v(n * item), dout(n * item);
    for (std::size_t j = 0; j < n; ++j) {
        const std::size_t from = r.items[j] * item;
        std::copy_n(p.q.begin() + static_cast<std::ptrdiff_t>(from), item, q.begin() + static_cast<std::ptrdiff_t>(j * item));
        std::copy_n(p.k.begin() + static_cast<std::ptrdiff_t>(from), item, k.begin() + static_cast<std::ptrdiff_t>(j * item));
        std::copy_n(p.v.begin() + static_cast<std::ptrdiff_t>(from), item, v.begin() + static_cast<std::ptrdiff_t>(j * item));
        std::copy_n(p.dout.begin() + static_cast<std::ptrdiff_t>(from), item, dout.begin() + static_cast<std::ptrdiff_t>(j * item));
    }
    const AttentionShape s{1, n, T, hs, p.shape.causal};
    for (std::vector<float>* x : {&r.out, &r.dq, &r.dk, &r.dv}) x->resize(n * item);
    r.lse.resize(n * T);
    if (n == 0) return r;
    attention_fast_forward(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), s);
    attention_fast_backward(r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), q.data(), k.data(),
                            v.data(), r.out.data(), r.lse.data(), s);
    return r;
}

// The reference's items of a whole (B, NH, T, width) tensor.
std::vector<float> items_of(const std::vector<float>& whole, const Reference& ref, std::size_t per_item) {
    std::vector<float> x;
    for (std::size_t i : ref.items) {
        x.insert(x.end(), whole.begin() + static_cast<std::ptrdiff_t>(i * per_item),
                 whole.begin() + static_cast<std::ptrdiff_t>((i + 1) * per_item));
    }
    return x;
}

// "Equal to float rounding": the split versions add the same float32 terms as one process
// in another order (per block, then merged). Each result's sums have at most T terms of at
// most its largest magnitude; reordering them moves the result by a few float32 ulps of
// that magnitude times √T (random rounding errors add like a random walk). 2⁻²³·√T·8 is
// 1.2e-4 of the scale at T = 16384 and 2.2e-5 at 512, 16× the random-sign estimate √T u
// (u = 2^-24); the worst case, 2γ_T = 2Tu of the scale (2e-3 at T = 16384), is above it, so
// the bound rests on the random-sign estimate. A wrong merge or a misplaced block
// changes the results by far more (the output by tens of percent).
double rounding_bound(const AttentionShape& s, double scale) {
    return 8.0 * std::sqrt(static_cast<double>(s.T)) * 0x1p-23 * std::max(scale, 1.0);
}

struct Results {
    std::vector<float> out, lse, dq, dk, dv;
};

void compare(mpi_test::Checks& checks, const std::string& what, const Results& whole,
             const Reference& ref, const AttentionShape& shape) {
    // Each rank compares the items it computed the reference for; the verdict is everyone's.
    struct Item {
        const char* name;
        std::vector<float> got;
        const std::vector<float>* expected;
    };
    const std::size_t T = shape.T, hs = shape.hs;
    const Item items[] = {{"out", items_of(whole.out, ref, T * hs), &ref.out},
                          {"lse", items_of(whole.lse, ref, T), &ref.lse},
                          {"dq", items_of(whole.dq, ref, T * hs), &ref.dq},
                          {"dk", items_of(whole.dk, ref, T * hs), &ref.dk},
                          {"dv", items_of(whole.dv, ref, T * hs), &ref.dv}};
    std::string detail;
    bool ok = true;
    for (const Item& item : items) {
        const mpi_test::Difference d =
            mpi_test::difference(item.got.data(), item.expected->data(), item.expected->size());
        const double bound = rounding_bound(shape, d.scale);
        ok = ok && d.max_abs <= bound;
        char buf[96];
        std::snprintf(buf, sizeof buf, "%s%s %.1e (bound %.1e)", detail.empty() ? "" : ", ",
                      item.name, d.max_abs, bound);
        detail += buf;
    }
    checks.check(ok, what, detail);
}

// FlashAttention's rule for one split result against float64: its error at most twice that
// of the plain float32 attention (attn::passes_flash_rule).
void flash_rule(mpi_test::Checks& checks, const std::string& what, const Problem& p,
                const std::vector<float>& out, const std::vector<float>& dq) {
    bool ok = true;
    std::string detail;
    if (checks.rank() == 0) {
        const std::size_t n = p.shape.qkv_size();
        std::vector<double> out64(n), dq64(n), dk64(n), dv64(n);
        const std::vector<double> q = to_double(p.q.data(), n), k = to_double(p.k.data(), n),
                                  v = to_double(p.v.data(), n), dout = to_double(p.dout.data(), n);
        attention_reference_forward(out64.data(), nullptr, q.data(), k.data(), v.data(), p.shape);
        attention_reference_backward(dq64.data(), dk64.data(), dv64.data(), dout.data(), q.data(),
                                     k.data(), v.data(), p.shape);
        std::vector<float> out32(n), dq32(n), dk32(n), dv32(n);
        attention_plain_forward(out32.data(), nullptr, p.q.data(), p.k.data(), p.v.data(), p.shape);
        attention_plain_backward(dq32.data(), dk32.data(), dv32.data(), p.dout.data(), p.q.data(),
                                 p.k.data(), p.v.data(), p.shape);
        const double e_out = max_abs_error(out.data(), out64.data(), n),
                     e_plain = max_abs_error(out32.data(), out64.data(), n);
        const double e_dq = max_abs_error(dq.data(), dq64.data(), n),
                     e_dq_plain = max_abs_error(dq32.data(), dq64.data(), n);
        ok = passes_flash_rule(e_out, e_plain, max_abs(out64.data(), n)) &&
             passes_flash_rule(e_dq, e_dq_plain, max_abs(dq64.data(), n));
        detail = mpi_test::format("out %.1e against plain %.1e; ", e_out, e_plain) +
                 mpi_test::format("dq %.1e against plain %.1e", e_dq, e_dq_plain);
    }
    checks.check(ok, what, detail);
}

}  // namespace

int main(int argc, char** argv) {
    mpi::World world(argc, argv);
    world.share_cpus();
    mpi_test::Checks checks;
    MergeRule merge = merge_partial_attention;
    std::string merge_name = "the log-sum-exp merge";
    std::size_t longest = 16384;
    for (int i = 1; i < argc; ++i) {
        if (std::string(argv[i]) == "--merge" && i + 1 < argc && std::string(argv[i + 1]) == "added") {
            merge = merge_adding_log_sum_exps;
            merge_name = "the WRONG merge (log-sum-exps added)";
            longest = 512;  // the first case is enough to fail
            ++i;
        } else if (std::string(argv[i]) == "--quick") {
            longest = 512;
        } else {
            if (world.rank() == 0) std::fprintf(stderr, "usage: %s [--merge added] [--quick]\n", argv[0]);
            return 2;
        }
    }
    const std::size_t N = static_cast<std::size_t>(world.size()), rank = static_cast<std::size_t>(world.rank());
    checks.note("ring and Ulysses attention on " + std::to_string(N) + " ranks, ring with " + merge_name);

    struct Case {
        AttentionShape shape;
        bool float64;  // also against float64 (small T only: the reference is O(T²) doubles)
    };
    const std::vector<Case> cases = {
        {{1, 4, 512, 64, true}, true},
        {{2, 4, 512, 32, false}, true},
        {{1, 4, 4096, 64, true}, false},
        {{1, 4, 16384, 64, true}, false},
    };
    for (const Case& c : cases) {
        const AttentionShape& s = c.shape;
        if (s.T > longest) continue;
        const Problem p(s, 19 + s.T);
        const Reference ref = single_process(p, rank, N);
        char title[128];
        std::snprintf(title, sizeof title, "B=%zu NH=%zu T=%zu hs=%zu %s", s.B, s.NH, s.T, s.hs,
                      s.causal ? "causal" : "not causal");

        for (SequenceOrder order : {SequenceOrder::zigzag, SequenceOrder::contiguous}) {
            if (!s.causal && order == SequenceOrder::contiguous) continue;  // the same blocks
            if (s.T == 16384 && order == SequenceOrder::contiguous) continue;  // zigzag covers it
            mpi::RingAttention ring(s, order, merge);
            const SequenceSplit& split = ring.split();
            const std::vector<float> q = local_of(p.q, split, rank, s.B, s.NH, s.hs),
                                     k = local_of(p.k, split, rank, s.B, s.NH, s.hs),
                                     v = local_of(p.v, split, rank, s.B, s.NH, s.hs),
                                     dout = local_of(p.dout, split, rank, s.B, s.NH, s.hs);
            std::vector<float> out(ring.local_floats()), lse(ring.local_rows()),
                dq(ring.local_floats()), dk(ring.local_floats()), dv(ring.local_floats());
            const std::size_t resident_before = mpi::resident_bytes();
            const bool peak_measured = mpi::reset_peak_resident();
            ring.forward(out.data(), lse.data(), q.data(), k.data(), v.data());
            const std::size_t forward_floats = ring.stats().peak_floats;
            ring.backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                          out.data(), lse.data());
            const std::size_t grown = mpi::peak_resident_bytes() > resident_before
                                          ? mpi::peak_resident_bytes() - resident_before : 0;
            const std::string what = std::string("ring attention, ") + sequence_order_name(order) +
                                     ", " + title + ": equal to one process";
            const Results whole{gather(out, split, s.B, s.NH, s.hs), gather(lse, split, s.B, s.NH, 1),
                                gather(dq, split, s.B, s.NH, s.hs), gather(dk, split, s.B, s.NH, s.hs),
                                gather(dv, split, s.B, s.NH, s.hs)};
            compare(checks, what, whole, ref, s);
            if (c.float64 && order == SequenceOrder::zigzag) {
                flash_rule(checks, std::string("ring attention, ") + title +
                                       ": FlashAttention's rule against float64",
                           p, whole.out, whole.dq);
            }
            if (s.T == 16384) {
                // Its buffers: 4 (k, v twice) forward and 10 backward local tensors and a few
                // pieces: O(T/N · hs); and what the process grew by is of that order too,
                // where one head's (T, T) scores alone would be 1 GiB.
                const std::size_t local = ring.local_floats();
                const std::size_t backward_floats = ring.stats().peak_floats;
                const std::size_t piece = local / split.pieces_per_rank();
                checks.check(forward_floats == 4 * local + piece + piece / s.hs &&
                                 backward_floats == 10 * local + 3 * piece,
                             "ring attention at T=16384 holds O(T/N · hs) floats per rank",
                             mpi_test::format("forward %.0f, backward %.0f floats; local tensor %.0f",
                                              static_cast<double>(forward_floats),
                                              static_cast<double>(backward_floats),
                                              static_cast<double>(local)));
                // Bytes: the ring's buffers, twice over for the fast attention's own working
                // memory and the allocator's slack, and 16 MiB for MPI's.
                const double limit = 2.0 * 4.0 * static_cast<double>(backward_floats) + 16.0 * (1 << 20);
                checks.check(!peak_measured || static_cast<double>(grown) <= limit,
                             "ring attention at T=16384: the resident memory grows by O(T/N · hs), no (T, T)",
                             mpi_test::format("grew %.1f MiB (bound %.1f MiB)", static_cast<double>(grown) / 1048576.0,
                                              limit / 1048576.0));
            }
        }

        if (s.NH % N == 0 && merge == merge_partial_attention) {
            mpi::UlyssesAttention ulysses(s);
            const SequenceSplit split{s.T, N, SequenceOrder::contiguous};
            const std::vector<float> q = local_of(p.q, split, rank, s.B, s.NH, s.hs),
                                     k = local_of(p.k, split, rank, s.B, s.NH, s.hs),
                                     v = local_of(p.v, split, rank, s.B, s.NH, s.hs),
                                     dout = local_of(p.dout, split, rank, s.B, s.NH, s.hs);
            std::vector<float> out(ulysses.local_floats()), lse(ulysses.local_rows()),
                dq(ulysses.local_floats()), dk(ulysses.local_floats()), dv(ulysses.local_floats());
            ulysses.forward(out.data(), lse.data(), q.data(), k.data(), v.data());
            ulysses.backward(dq.data(), dk.data(), dv.data(), dout.data());
            const Results whole{gather(out, split, s.B, s.NH, s.hs), gather(lse, split, s.B, s.NH, 1),
                                gather(dq, split, s.B, s.NH, s.hs), gather(dk, split, s.B, s.NH, s.hs),
                                gather(dv, split, s.B, s.NH, s.hs)};
            compare(checks, std::string("Ulysses attention, ") + title + ": equal to one process",
                    whole, ref, s);
        }
    }
    return checks.finish();
}
