// A fault injected on purpose (attn/fault.hpp).
#include "attn/fault.hpp"

#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

namespace attn {

namespace {

struct FaultPlan {
    std::string where;  // empty: no fault
    int rank = -1;
    long nth = 0;
};

// ATTN_FAULT=where:rank:nth, read once; anything else in it is no plan (an injection that
// cannot be read is a mistake of the check that set it, which then sees no fault).
FaultPlan read_plan() {
    FaultPlan plan;
    const char* text = std::getenv("ATTN_FAULT");
    if (!text) return plan;
    const std::string s = text;
    const std::size_t a = s.find(':'), b = a == std::string::npos ? a : s.find(':', a + 1);
    if (b == std::string::npos) return plan;
    try {
        plan.rank = std::stoi(s.substr(a + 1, b - a - 1));
        plan.nth = std::stol(s.substr(b + 1));
        plan.where = s.substr(0, a);
    } catch (const std::exception&) {
        plan.where.clear();
    }
    return plan;
}

}  // namespace

void fault_point(const char* where, int rank) {
    static const FaultPlan plan = read_plan();
    if (plan.where.empty() || plan.rank != rank || plan.where != where) return;
    static std::mutex mutex;
    static long calls = 0;
    long call = 0;
    {
        std::lock_guard<std::mutex> lock(mutex);
        call = ++calls;
    }
    if (call == plan.nth) {
        throw std::runtime_error("injected fault at " + plan.where + ", call " + std::to_string(call) +
                                 " (ATTN_FAULT)");
    }
}

}  // namespace attn
