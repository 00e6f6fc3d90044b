// doctest's main, compiled once for every check and test program, with a crash report of
// our own in place of doctest's.
//
// doctest's handler of fatal signals reports through its reporters, which allocate. When a
// learner's out-of-bounds write corrupts the heap, glibc notices inside malloc and aborts
// while holding the allocator's lock; an allocation in the SIGABRT handler then waits on that
// lock for ever, and the check hangs instead of crashing. So doctest's handler is switched
// off here, and ours writes the running check's name (copied into fixed buffers when the
// check starts) with write(2) only, then lets the signal end the program as it would have.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#define DOCTEST_CONFIG_NO_POSIX_SIGNALS
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <typeinfo>

namespace {

// What the crash report needs, written only outside signal handlers.
struct RunningCheck {
    char file[512] = "";
    char line[16] = "";
    char name[512] = "";
    char subcases[4][256] = {};  // the innermost few subcases, as doctest shows them
    int depth = 0;
    bool running = false;
};
RunningCheck running_check;

// Copies at most size - 1 bytes and terminates: no allocation, no exception.
void copy_into(char* to, std::size_t size, const char* from) {
    std::size_t n = 0;
    for (; from && from[n] != '\0' && n + 1 < size; ++n) to[n] = from[n];
    to[n] = '\0';
}

// write(2) of a whole string, as far as the descriptor takes it (async-signal-safe).
void write_all(int fd, const char* text) {
    std::size_t left = std::strlen(text);
    while (left > 0) {
        const ssize_t n = ::write(fd, text, left);
        if (n <= 0) return;
        text += n;
        left -= static_cast<std::size_t>(n);
    }
}

struct SignalName {
    int id;
    const char* what;  // as doctest's own report said it
};
constexpr SignalName signal_names[] = {
    {SIGSEGV, "SIGSEGV - Segmentation violation signal"},
    {SIGABRT, "SIGABRT - Abort (abnormal termination) signal"},
    {SIGFPE, "SIGFPE - Floating point error signal"},
    {SIGBUS, "SIGBUS - Bus error signal"},
    {SIGILL, "SIGILL - Illegal instruction signal"},
    {SIGTERM, "SIGTERM - Termination request signal"},
    {SIGINT, "SIGINT - Terminal interrupt signal"},
};
constexpr std::size_t n_signals = sizeof signal_names / sizeof signal_names[0];
struct sigaction previous[n_signals];

}  // namespace

// The sanitizers' unwinder, linked in only by the sanitizer builds (./workbook check NN
// --debug): a check stopped at the time limit then shows where it was running, so that a
// loop that never ends names its line as a memory error does.
extern "C" void __sanitizer_print_stack_trace() __attribute__((weak));
// Called by a sanitizer as it ends the program after its own report (with its own stack):
// an abort that follows one needs no second stack.
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace {

volatile sig_atomic_t sanitizer_reported = 0;
void on_sanitizer_death() { sanitizer_reported = 1; }

// Reports the running check in doctest's layout (so that tools/check_report.awk and
// `./workbook check` read it as they read doctest's), puts back the handler that was there
// before (the default, or a sanitizer's), and lets the signal take its course: a fault
// happens again on return, a signal sent by raise() or kill() is sent again.
void on_fatal_signal(int sig, siginfo_t* info, void*) {
    std::size_t k = 0;
    while (k < n_signals && signal_names[k].id != sig) ++k;
    const RunningCheck& c = running_check;
    const int out = STDOUT_FILENO;
    write_all(out, "===============================================================================\n");
    if (c.running) {
        write_all(out, c.file);
        write_all(out, ":");
        write_all(out, c.line);
        write_all(out, ":\nTEST CASE:  ");
        write_all(out, c.name);
        write_all(out, "\n");
        for (int d = 0; d < c.depth && d < 4; ++d) {
            write_all(out, "  ");
            write_all(out, c.subcases[d]);
            write_all(out, "\n");
        }
        write_all(out, "\n");
        write_all(out, c.file);
        write_all(out, ":");
        write_all(out, c.line);
        write_all(out, ": ");
    }
    const bool sent = info == nullptr || info->si_code <= 0;  // by kill(), raise() or abort()
    const bool stop = sig == SIGTERM || sig == SIGINT;
    write_all(out, stop ? "FATAL ERROR: test case STOPPED: " : "FATAL ERROR: test case CRASHED: ");
    write_all(out, k < n_signals ? signal_names[k].what : "a fatal signal");
    write_all(out, c.running ? "\n\n" : " (outside any check)\n\n");
    if (stop && __sanitizer_print_stack_trace != nullptr) {
        write_all(out, "The stack where the check was stopped:\n");
        __sanitizer_print_stack_trace();  // to stderr, which ./workbook check logs with stdout
        write_all(STDERR_FILENO, "(end of the stack)\n");
    } else if (sig == SIGABRT && __sanitizer_print_stack_trace != nullptr && !sanitizer_reported) {
        // An abort in the sanitizer builds: a failed assertion, libstdc++'s among them (an
        // index past a std::vector's or std::array's end, _GLIBCXX_ASSERTIONS). Its message
        // names the container; the stack names the line that indexed it.
        write_all(out, "The stack where the program aborted:\n");
        __sanitizer_print_stack_trace();
        write_all(STDERR_FILENO, "(end of the stack)\n");
    }
    if (k < n_signals) sigaction(sig, &previous[k], nullptr);
    if (sent) raise(sig);  // blocked until this handler returns, then delivered again
}

alignas(16) char alternate_stack[64 * 1024];  // a stack overflow still gets its report

void install_crash_report() {
    if (__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(on_sanitizer_death);
    stack_t stack{};
    stack.ss_sp = alternate_stack;
    stack.ss_size = sizeof alternate_stack;
    sigaltstack(&stack, nullptr);
    struct sigaction action {};
    action.sa_sigaction = on_fatal_signal;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    for (std::size_t k = 0; k < n_signals; ++k) {
        sigaction(signal_names[k].id, nullptr, &previous[k]);
        // A signal the program was started ignoring (nohup) stays ignored.
        if (previous[k].sa_handler == SIG_IGN) continue;
        sigaction(signal_names[k].id, &action, &previous[k]);
    }
}

}  // namespace

#if defined(__SANITIZE_ADDRESS__)
// In the sanitizer builds with xtensor's assertions (./workbook check NN --debug), an index
// past the end of a tensor is caught by xtensor before AddressSanitizer sees the access, and
// thrown as an exception whose message names the index and the axis but no line. The stack
// where it is thrown, printed once, names the learner's line as the sanitizer's report would.
// (The type is void* as the compiler declares __cxa_throw itself; it is a std::type_info.)
extern "C" [[noreturn]] void __cxa_throw(void* thrown, void* type, void (*destroy)(void*)) {
    using Throw = void (*)(void*, void*, void (*)(void*));
    static const Throw real_throw = reinterpret_cast<Throw>(dlsym(RTLD_NEXT, "__cxa_throw"));
    static bool shown = false;
    if (!shown && *static_cast<const std::type_info*>(type) == typeid(std::runtime_error) &&
        std::strstr(static_cast<std::runtime_error*>(thrown)->what(), "is out of bounds for axis")) {
        shown = true;
        write_all(STDOUT_FILENO, "The stack where xtensor found an index out of bounds:\n");
        __sanitizer_print_stack_trace();
        write_all(STDERR_FILENO, "(end of the stack)\n");
    }
    real_throw(thrown, type, destroy);
    __builtin_unreachable();
}
#endif

namespace {

// The file named by ATTN_CHECK_PROGRESS, if any, holds the name of the check now running,
// so that `./workbook check` can say which one is taking long.
void write_progress(const char* name) {
    const char* path = std::getenv("ATTN_CHECK_PROGRESS");
    if (path == nullptr || *path == '\0') return;
    const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    write_all(fd, name);
    write_all(fd, "\n");
    ::close(fd);
}

// A doctest listener: it sees every check start and end, whatever the reporter.
struct RunningCheckListener : doctest::IReporter {
    explicit RunningCheckListener(const doctest::ContextOptions&) {}
    void report_query(const doctest::QueryData&) override {}
    void test_run_start() override { install_crash_report(); }
    void test_run_end(const doctest::TestRunStats&) override {}
    void test_case_start(const doctest::TestCaseData& tc) override {
        RunningCheck& c = running_check;
        copy_into(c.file, sizeof c.file, tc.m_file.c_str());
        const int line = static_cast<int>(tc.m_line);
        copy_into(c.line, sizeof c.line, std::to_string(line).c_str());
        copy_into(c.name, sizeof c.name, tc.m_name);
        c.depth = 0;
        c.running = true;
        write_progress(tc.m_name);
    }
    void test_case_reenter(const doctest::TestCaseData&) override { running_check.depth = 0; }
    void test_case_end(const doctest::CurrentTestCaseStats&) override {
        running_check.running = false;
    }
    void test_case_exception(const doctest::TestCaseException&) override {}
    void subcase_start(const doctest::SubcaseSignature& s) override {
        RunningCheck& c = running_check;
        if (c.depth < 4) copy_into(c.subcases[c.depth], sizeof c.subcases[0], s.m_name.c_str());
        ++c.depth;
    }
    void subcase_end() override {
        if (running_check.depth > 0) --running_check.depth;
    }
    void log_assert(const doctest::AssertData&) override {}
    void log_message(const doctest::MessageData&) override {}
    void test_case_skipped(const doctest::TestCaseData&) override {}
};
DOCTEST_REGISTER_LISTENER("running_check", 1, RunningCheckListener);

}  // namespace
