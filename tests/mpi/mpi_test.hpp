// What the MPI tests share: checks that every rank makes together and rank 0 reports.
//
// A test here runs as N ranks under mpirun. Every rank calls each check in the same order
// (a check is a collective call), so a failure on any rank is known to all and none is left
// waiting; rank 0 prints "ok: ..." or "FAIL: ..." with the number of ranks that failed, and
// every rank exits with the same status.
#pragma once

#include "format.hpp"

#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace mpi_test {

class Checks {
public:
    Checks() {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        MPI_Comm_size(MPI_COMM_WORLD, &size_);
    }
    int rank() const { return rank_; }
    int size() const { return size_; }

    // `ok` on this rank; `detail` (this rank's numbers) is printed by the first failing rank.
    bool check(bool ok, const std::string& what, const std::string& detail = "") {
        int mine = ok ? 0 : 1, failing = 0, first = size_;
        MPI_Allreduce(&mine, &failing, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        int me = ok ? size_ : rank_;
        MPI_Allreduce(&me, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (failing == 0) {
            if (rank_ == 0) std::printf("ok: %s%s%s\n", what.c_str(), detail.empty() ? "" : ": ", detail.c_str());
        } else {
            ++failures_;
            if (rank_ == first) {
                std::printf("FAIL: %s (on %d of %d ranks; rank %d: %s)\n", what.c_str(), failing,
                            size_, rank_, detail.c_str());
            }
        }
        std::fflush(stdout);
        MPI_Barrier(MPI_COMM_WORLD);  // the lines in order
        return failing == 0;
    }
    // Prints a line from rank 0 only.
    void note(const std::string& line) const {
        if (rank_ == 0) std::printf("%s\n", line.c_str());
        std::fflush(stdout);
    }
    // The exit status, the same on every rank.
    int finish() const {
        if (rank_ == 0) {
            std::printf("%s: %d failed check%s\n", failures_ ? "FAILED" : "passed", failures_,
                        failures_ == 1 ? "" : "s");
        }
        return failures_ ? 1 : 0;
    }

private:
    int rank_ = 0, size_ = 1, failures_ = 0;
};

// The largest |a − b| and the largest |b| over two buffers.
struct Difference {
    double max_abs = 0.0, scale = 0.0;
};
inline Difference difference(const float* a, const float* b, std::size_t n) {
    Difference d;
    for (std::size_t i = 0; i < n; ++i) {
        const double x = a[i], y = b[i];
        d.max_abs = std::max(d.max_abs, std::isnan(x) || std::isnan(y) ? INFINITY : std::fabs(x - y));
        d.scale = std::max(d.scale, std::fabs(y));
    }
    return d;
}

}  // namespace mpi_test
