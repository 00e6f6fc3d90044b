// A lesson's parts on several ranks: started, their numbers printed and read back.
#include "attn/mpi/parts.hpp"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <system_error>
#include <unistd.h>
#include <stdexcept>

namespace attn::mpi {

ScratchFolder::ScratchFolder(const std::string& prefix)
    : path_(std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
}

ScratchFolder::~ScratchFolder() {
    std::error_code ec;  // nothing to say if it is gone already
    std::filesystem::remove_all(path_, ec);
}

Numbers read_numbers(const std::string& output) {
    Numbers numbers;
    std::istringstream in(output);
    for (std::string line; std::getline(in, line);) {
        std::istringstream fields(line);
        std::string key;
        if (!(fields >> key)) continue;
        std::vector<double>& values = numbers[key];
        for (double v; fields >> v;) values.push_back(v);
    }
    return numbers;
}

const std::vector<double>& need(const Numbers& numbers, const std::string& key) {
    const auto it = numbers.find(key);
    if (it == numbers.end()) throw std::runtime_error("the ranks did not report " + key);
    return it->second;
}

Numbers run_part(LaunchOptions options, const std::string& what, LaunchResult* ended) {
    options.capture_output = true;
    const LaunchResult result = run_ranks(this_program(), {}, options);
    if (ended) {
        *ended = result;
    } else if (result.status != 0) {
        throw std::runtime_error("the " + what + " part on " + std::to_string(options.ranks) +
                                 " ranks: " + describe_end(result, options.ranks));
    }
    return read_numbers(result.output);
}

int run_rank(int argc, char** argv, const char* program, const std::function<void(World&)>& part) {
    World world(argc, argv);
    try {
        part(world);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: rank %d: error: %s\n", program, world.rank(), e.what());
        abort_job(1);  // the others may be waiting for this rank
    }
    return 0;
}

std::string environment(const char* key) {
    const char* v = std::getenv(key);
    return v ? v : "";
}

void say(const std::string& key, const std::vector<double>& values) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0) return;
    std::printf("%s", key.c_str());
    for (double v : values) std::printf(" %.10g", v);
    std::printf("\n");
    std::fflush(stdout);
}

std::vector<double> gather_from_ranks(double value) {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::vector<double> all(static_cast<std::size_t>(size));
    MPI_Gather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return all;
}

}  // namespace attn::mpi
