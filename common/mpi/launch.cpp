// Starting a program as N ranks through mpirun, and reading how the job ended.
#include "attn/mpi/launch.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <poll.h>
#include <stdexcept>
#include <string>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;  // the process's environment (POSIX)

#ifndef ATTN_MPIEXEC
#define ATTN_MPIEXEC "mpirun"
#endif

namespace attn::mpi {

namespace {

volatile sig_atomic_t g_mpirun_pid = 0;
volatile sig_atomic_t g_signals = 0;
char g_stop_line[512] = {};  // LaunchOptions::stop_line, with its newline; empty: none

// Ctrl-C or SIGTERM to the launcher, which mpirun (in a process group of its own) does not
// see: the first asks the ranks to stop (SIGUSR1, which mpirun passes on) when they can, the
// second, or the first when they cannot, has mpirun end them (SIGTERM).
void on_stop_signal(int) {
    const int saved = errno;
    if (g_mpirun_pid > 0) {
        if (g_signals++ == 0 && g_stop_line[0] != '\0') {
            kill(static_cast<pid_t>(g_mpirun_pid), SIGUSR1);
            ssize_t ignored = write(STDERR_FILENO, g_stop_line, std::strlen(g_stop_line));
            (void)ignored;
        } else {
            kill(static_cast<pid_t>(g_mpirun_pid), SIGTERM);
        }
    }
    errno = saved;
}

// mpirun frames each report of its own between lines of dashes.
bool is_frame(const std::string& line) {
    return line.size() >= 20 && line.find_first_not_of('-') == std::string::npos;
}

// The number after the first `word ` in text (for "rank 2", "signal 9"), or -1.
int number_after(const std::string& text, const std::string& word) {
    for (std::size_t at = text.find(word + " "); at != std::string::npos;
         at = text.find(word + " ", at + 1)) {
        const std::size_t digits = at + word.size() + 1;
        if (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) {
            return std::atoi(text.c_str() + digits);
        }
    }
    return -1;
}

// Reads what mpirun's reports say: which rank ended the job and by which signal, as in
// "mpirun noticed that process rank 2 with PID 0 on node vm exited on signal 9 (Killed)."
void read_report(const std::string& report, LaunchResult& result) {
    if (result.failed_rank < 0) result.failed_rank = number_after(report, "rank");
    if (result.signal == 0) result.signal = std::max(0, number_after(report, "signal"));
}

// Splits what arrives on a pipe into lines; a partial last line waits for the rest.
struct LineReader {
    std::string pending;
    template <class OnLine>
    void feed(const char* data, std::size_t n, OnLine on_line) {
        pending.append(data, n);
        std::size_t start = 0, end;
        while ((end = pending.find('\n', start)) != std::string::npos) {
            on_line(pending.substr(start, end - start));
            start = end + 1;
        }
        pending.erase(0, start);
    }
};

}  // namespace

std::string mpirun_path() { return ATTN_MPIEXEC; }

std::vector<std::string> local_mpirun_options() {
    // rtc_hwloc_vmhole none: the daemons do not share their hardware map through shared
    // memory mapped at a guessed address (a crash in hwloc_shmem_topology_write, seen in
    // daemons on other hosts); with no pinning the map is not needed.
    std::vector<std::string> options = {"--oversubscribe", "--bind-to", "none",
                                        "--mca", "rtc_hwloc_vmhole", "none"};
    if (geteuid() == 0) options.push_back("--allow-run-as-root");
    return options;
}

std::string this_program() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

LaunchResult run_ranks(const std::string& program, const std::vector<std::string>& args,
                       const LaunchOptions& options) {
    if (options.ranks < 1) {
        throw std::invalid_argument("a job needs at least one rank, got " + std::to_string(options.ranks));
    }
    std::vector<std::string> command = {mpirun_path(), "-np", std::to_string(options.ranks)};
    for (const std::string& o : local_mpirun_options()) command.push_back(o);
    command.push_back(program);
    command.insert(command.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : command) argv.push_back(a.data());
    argv.push_back(nullptr);

    // The ranks' environment: this process's, with the options' pairs set, made before the
    // fork (a child of a process with threads may only call what is safe after a fork).
    std::map<std::string, std::string> environment;
    for (char** e = environ; *e != nullptr; ++e) {
        const std::string pair = *e;
        const std::size_t eq = pair.find('=');
        if (eq != std::string::npos) environment[pair.substr(0, eq)] = pair.substr(eq + 1);
    }
    for (const std::string& pair : options.environment) {
        const std::size_t eq = pair.find('=');
        environment[pair.substr(0, eq)] = eq == std::string::npos ? "" : pair.substr(eq + 1);
    }
#if defined(__SANITIZE_ADDRESS__)
    // In the sanitizer builds the ranks are checked for memory errors but not for leaks:
    // Open MPI leaves allocations of its own at exit, in plugins it loads and unloads itself
    // (their frames are unknown modules by then) and in libraries built without frame
    // pointers (where the fast unwinder stops), so no suppression can name them. This
    // process, which never starts MPI, keeps its leak check.
    std::string& asan = environment["ASAN_OPTIONS"];
    asan += (asan.empty() ? "" : ":") + std::string("detect_leaks=0");
#endif
    std::vector<std::string> env_strings;
    for (const auto& [name, value] : environment) env_strings.push_back(name + "=" + value);
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);

    int err_pipe[2], out_pipe[2] = {-1, -1};
    if (pipe(err_pipe) != 0 || (options.capture_output && pipe(out_pipe) != 0)) {
        throw std::runtime_error(std::string("cannot make a pipe for mpirun: ") + std::strerror(errno));
    }
    std::snprintf(g_stop_line, sizeof g_stop_line, "%s%s", options.stop_line.c_str(),
                  options.stop_line.empty() ? "" : "\n");
    g_signals = 0;
    // The signals are blocked across the fork, so that none reaches this process between
    // mpirun's start and the handlers below without being passed on.
    sigset_t stops, old_mask;
    sigemptyset(&stops);
    sigaddset(&stops, SIGINT);
    sigaddset(&stops, SIGTERM);
    sigprocmask(SIG_BLOCK, &stops, &old_mask);
    const pid_t parent = getpid();
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) {
        sigprocmask(SIG_SETMASK, &old_mask, nullptr);
        throw std::runtime_error(std::string("cannot start mpirun: ") + std::strerror(errno));
    }
    if (pid == 0) {
        // mpirun in a process group of its own: a Ctrl-C at the terminal reaches this
        // process only, which decides what the ranks get. It reads no terminal (a process
        // outside the terminal's foreground group that did would be stopped), and it ends
        // when this process does, however that ends (SIGKILL included).
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(1);  // this process had ended already
        const int null = open("/dev/null", O_RDONLY);
        if (null >= 0) dup2(null, STDIN_FILENO);
        sigprocmask(SIG_SETMASK, &old_mask, nullptr);
        dup2(err_pipe[1], STDERR_FILENO);
        if (options.capture_output) dup2(out_pipe[1], STDOUT_FILENO);
        for (int fd : {err_pipe[0], err_pipe[1], out_pipe[0], out_pipe[1]}) {
            if (fd >= 0) close(fd);
        }
        execve(argv[0], argv.data(), envp.data());
        const char message[] = "cannot run mpirun\n";
        ssize_t ignored = write(STDERR_FILENO, message, sizeof message - 1);
        (void)ignored;
        _exit(127);
    }
    close(err_pipe[1]);
    if (options.capture_output) close(out_pipe[1]);

    // While mpirun runs, Ctrl-C and SIGTERM come to this process (see on_stop_signal), which
    // waits to say how the job ended.
    g_mpirun_pid = pid;
    struct sigaction forward{}, old_int{}, old_term{};
    forward.sa_handler = on_stop_signal;
    sigemptyset(&forward.sa_mask);
    sigaction(SIGINT, &forward, &old_int);
    sigaction(SIGTERM, &forward, &old_term);
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);

    LaunchResult result;
    LineReader err_lines, out_lines;
    bool in_frame = false;
    std::string report;
    auto on_err_line = [&](const std::string& line) {
        // mpirun's note that it passed a signal on ("mpiexec: Forwarding signal 10 to job"):
        // the launcher has said what the signal does.
        if (line.find(": Forwarding signal ") != std::string::npos && line.size() < 80) return;
        // Open MPI's shared-memory transport, when the rank whose memory it was copying a
        // message from is gone ("[host:pid] Read -1, expected 196864, errno = 3", ESRCH): the
        // launcher's own line says which rank ended and how.
        if (line.find("] Read -1, expected ") != std::string::npos && line.size() < 100 &&
            line.compare(line.size() - 11, 11, ", errno = 3") == 0) {
            return;
        }
        // mpirun's own report of a rank's MPI_Abort, when it arrives garbled: Open MPI 4.1
        // then prints "[host:pid] [[job,0],0] ORTE_ERROR_LOG: Data unpack would read past
        // end of buffer in file …/orte/util/show_help.c at line 507" (or "Out of resource",
        // "had inadequate space") instead of the framed "MPI_ABORT was invoked on rank N"; it
        // happens at random, with or without this file's options. The rank that aborted has
        // said why in its own line (failed_rank stays −1: the status tells a rank's error).
        if (line.find("] ORTE_ERROR_LOG: ") != std::string::npos &&
            line.find("show_help.c at line ") != std::string::npos && line.size() < 200) {
            return;
        }
        if (is_frame(line)) {
            in_frame = !in_frame;
            if (!in_frame) read_report(report, result);
            report.clear();
        } else if (in_frame) {
            report += line + "\n";
        } else {
            std::fprintf(stderr, "%s\n", line.c_str());
            std::fflush(stderr);
        }
    };
    std::vector<pollfd> fds = {{err_pipe[0], POLLIN, 0}};
    if (options.capture_output) fds.push_back({out_pipe[0], POLLIN, 0});
    char buffer[4096];
    int open_pipes = static_cast<int>(fds.size());
    while (open_pipes > 0) {
        if (poll(fds.data(), fds.size(), -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (pollfd& p : fds) {
            if (p.fd < 0 || !(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
            const ssize_t n = read(p.fd, buffer, sizeof buffer);
            if (n <= 0) {
                close(p.fd);
                p.fd = -1;
                --open_pipes;
            } else if (p.fd == err_pipe[0]) {
                err_lines.feed(buffer, static_cast<std::size_t>(n), on_err_line);
            } else {
                out_lines.feed(buffer, static_cast<std::size_t>(n),
                               [&](const std::string& line) { result.output += line + "\n"; });
            }
        }
    }
    if (!err_lines.pending.empty()) on_err_line(err_lines.pending);
    result.output += out_lines.pending;
    int wstatus = 0;
    while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }
    g_mpirun_pid = 0;
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    if (WIFEXITED(wstatus)) {
        result.status = WEXITSTATUS(wstatus);
    } else {
        result.status = 128 + WTERMSIG(wstatus);  // mpirun itself ended by a signal
    }
    if (result.status == 127 && result.failed_rank < 0 && result.signal == 0) {
        throw std::runtime_error("cannot run " + mpirun_path() +
                                 " (Open MPI's mpirun: install openmpi-bin)");
    }
    return result;
}

std::string describe_end(const LaunchResult& r, int ranks) {
    const std::string of = " of " + std::to_string(ranks);
    if (r.signal != 0) {
        const char* name = r.signal == SIGKILL ? "SIGKILL" : r.signal == SIGTERM ? "SIGTERM"
                         : r.signal == SIGSEGV ? "SIGSEGV" : r.signal == SIGINT ? "SIGINT"
                         : r.signal == SIGABRT ? "SIGABRT" : "a signal";
        const std::string who = r.failed_rank >= 0 ? "rank " + std::to_string(r.failed_rank) + of
                                                   : "a rank";
        return who + (r.signal == SIGKILL ? " was killed" : " ended") + " (signal " +
               std::to_string(r.signal) + ", " + name + ") and mpirun stopped the other ranks";
    }
    if (r.failed_rank >= 0) {
        return "rank " + std::to_string(r.failed_rank) + of + " ended with an error (exit status " +
               std::to_string(r.status) + ") and mpirun stopped the other ranks";
    }
    if (r.status >= 128) {
        return "mpirun was stopped (signal " + std::to_string(r.status - 128) +
               ") and with it the ranks";
    }
    return "the ranks ended with exit status " + std::to_string(r.status);
}

}  // namespace attn::mpi
