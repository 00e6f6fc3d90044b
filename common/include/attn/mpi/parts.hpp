/// @file parts.hpp
/// @brief A lesson that runs parts of itself on several ranks (lessons 19 and 21): the
/// lesson's process starts its own program again as N ranks with the part to run named in
/// their environment, rank 0 prints that part's numbers as `key value…` lines, and the
/// lesson reads them back and explains them.
#pragma once

#include "attn/mpi/launch.hpp"
#include "attn/mpi/world.hpp"

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace attn::mpi {

/// What a part's rank 0 printed: each line's first word, and the numbers after it.
using Numbers = std::map<std::string, std::vector<double>>;

/// A folder of its own for the files a lesson's parts write (checkpoints, run folders), in
/// the system's temp folder, empty when made and removed with everything in it when this
/// goes. Not copyable.
class ScratchFolder {
public:
    /// @param prefix the start of its name, e.g. "attn_lesson21"; the process id follows
    explicit ScratchFolder(const std::string& prefix);
    ~ScratchFolder();
    ScratchFolder(const ScratchFolder&) = delete;             ///< one owner
    ScratchFolder& operator=(const ScratchFolder&) = delete;  ///< one owner
    /// Its path. @return the folder
    const std::filesystem::path& path() const { return path_; }

private:
    std::filesystem::path path_;
};

/// The `key value…` lines of a part's output, read back; lines with no number are kept with
/// none. @param output what rank 0 printed @return the numbers by key
Numbers read_numbers(const std::string& output);

/// The numbers of one key. @param numbers a part's numbers @param key the key
/// @return its numbers @throws std::runtime_error when the ranks did not report it
const std::vector<double>& need(const Numbers& numbers, const std::string& key);

/// Runs this program as `options.ranks` ranks (its output captured) and reads back what rank
/// 0 printed. @param options the ranks and their environment, which names the part
/// @param what the part, for the error @param ended where to leave how the job ended; when
/// null, a job that did not end with 0 is an error
/// @return the numbers @throws std::runtime_error for a job that failed (ended null)
Numbers run_part(LaunchOptions options, const std::string& what, LaunchResult* ended = nullptr);

/// A rank's side of a part: starts MPI, runs `part`, and turns an exception into one line on
/// stderr (`program: rank r: error: …`) and the end of the whole job, since the other ranks
/// may be waiting for this one. @param argc main's argc @param argv main's argv
/// @param program the program's name, for the line @param part the work, given the world
/// @return the process's exit status (0; a failure ends the job instead)
int run_rank(int argc, char** argv, const char* program, const std::function<void(World&)>& part);

/// A variable of this process's environment. @param key its name @return its value, or ""
/// when it is not set
std::string environment(const char* key);

/// On rank 0 of MPI's world, prints `key v1 v2 …` (10 significant digits) and flushes;
/// other ranks print nothing. MPI must be initialised. @param key the key
/// @param values its numbers
void say(const std::string& key, const std::vector<double>& values);

/// One number from every rank of MPI's world, on rank 0 in rank order (elsewhere
/// zeros). MPI must be initialised. @param value this rank's @return every rank's
std::vector<double> gather_from_ranks(double value);

}  // namespace attn::mpi
