// A line's numbers, printf-formatted (the MPI tests' messages).
#pragma once

#include <cstdio>
#include <string>

namespace mpi_test {

inline std::string format(const char* fmt, double a, double b = 0.0, double c = 0.0) {
    char buf[256];
    std::snprintf(buf, sizeof buf, fmt, a, b, c);
    return buf;
}

}  // namespace mpi_test
