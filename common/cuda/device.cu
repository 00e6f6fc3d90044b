#include "attn/cuda/device.hpp"
#include "check.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace attn::cuda {

#ifndef ATTN_CUDA_ARCHITECTURES
#define ATTN_CUDA_ARCHITECTURES "the simulator's"
#endif

namespace {
// Has machine code (or PTX) for the GPU only if the build's architectures cover it.
__global__ void probe_kernel() {}
}  // namespace

bool device_available(std::string* why) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        if (why) *why = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device found";
        cudaGetLastError();  // clear the sticky error so later calls start clean
        return false;
    }
    cudaFuncAttributes attributes{};
    const cudaError_t image = cudaFuncGetAttributes(&attributes, probe_kernel);
    if (image != cudaSuccess) {
        cudaDeviceProp p{};
        cudaGetDeviceProperties(&p, 0);
        if (why) {
            *why = std::string(p.name) + " (compute capability " + std::to_string(p.major) + "." +
                   std::to_string(p.minor) + ") is not among the architectures this build compiled for (" +
                   ATTN_CUDA_ARCHITECTURES +
                   "): reconfigure with -DCMAKE_CUDA_ARCHITECTURES=native and rebuild (" +
                   cudaGetErrorString(image) + ")";
        }
        cudaGetLastError();
        return false;
    }
    return true;
}

std::string device_summary() {
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    char buf[640];  // room for the longest name (256) and the numbers: no truncation
    std::snprintf(buf, sizeof buf, "%s, compute capability %d.%d, %.1f GiB, %d SMs", p.name,
                  p.major, p.minor, static_cast<double>(p.totalGlobalMem) / (1 << 30),
                  p.multiProcessorCount);
    return buf;
}

#if ATTN_CUDA_SIMULATED
namespace {
// A mangled name with every anonymous namespace's name made the same: g++ calls one
// "_GLOBAL__N_1", nvcc gives each file's its own ("_GLOBAL__N__c1b31aed_18_attention_flash_cu_…"),
// and g++'s mark of internal linkage dropped.
std::string without_anonymous_names(const std::string& m) {
    std::string out;
    std::size_t i = 0;
    while (i < m.size()) {
        if (m[i] < '0' || m[i] > '9') {
            out += m[i++];
            continue;
        }
        std::size_t j = i;
        while (j < m.size() && m[j] >= '0' && m[j] <= '9') ++j;
        const std::size_t length = std::stoul(m.substr(i, j - i));
        if (m.compare(j, 11, "_GLOBAL__N_") == 0 && j + length <= m.size()) {
            out += "(anonymous)";
            i = j + length;
            // g++ marks a name of internal linkage with L (_GLOBAL__N_1L20flash_…); nvcc does not.
            if (i + 1 < m.size() && m[i] == 'L' && m[i + 1] >= '0' && m[i + 1] <= '9') ++i;
        } else {
            out.append(m, i, j - i);
            i = j;
        }
    }
    return out;
}

// Registers per thread of each kernel on sm_90, from ptxas's reports (common/CMakeLists.txt
// writes them to build/cuda_resources/ where nvcc is present), found beside the program or
// one folder up; empty where there are none.
const std::map<std::string, int>& ptxas_registers() {
    static const std::map<std::string, int> table = [] {
        std::map<std::string, int> t;
        std::error_code ec;
        const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
        if (ec) return t;
        for (const auto& dir : {exe.parent_path() / "cuda_resources", exe.parent_path().parent_path() / "cuda_resources"}) {
            if (!std::filesystem::is_directory(dir, ec)) continue;
            for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
                if (entry.path().extension() != ".txt") continue;
                std::ifstream in(entry.path());
                std::string line, kernel;
                while (std::getline(in, line)) {
                    const auto at = line.find("Compiling entry function '");
                    if (at != std::string::npos) {
                        const auto start = at + 26, end = line.find('\'', start);
                        kernel = end == std::string::npos ? "" : without_anonymous_names(line.substr(start, end - start));
                        continue;
                    }
                    const auto used = line.find("Used ");
                    if (!kernel.empty() && used != std::string::npos && line.find(" registers") != std::string::npos) {
                        t[kernel] = std::atoi(line.c_str() + used + 5);
                        kernel.clear();
                    }
                }
            }
            break;
        }
        return t;
    }();
    return table;
}
}  // namespace

bool count_work(bool on) {
    cuda_sim::set_work_counting(on);
    return true;
}

std::vector<roofline::Launch> take_counted_work(bool* all_counted) {
    std::vector<roofline::Launch> out;
    if (all_counted) *all_counted = true;
    for (const cuda_sim::Work& w : cuda_sim::take_work()) {
        if (!w.counted && all_counted) *all_counted = false;
        auto it = std::find_if(out.begin(), out.end(), [&](const roofline::Launch& l) { return l.name == w.name; });
        const std::size_t blocks = static_cast<std::size_t>(w.grid.x) * w.grid.y * w.grid.z;
        if (it == out.end()) {
            roofline::Launch l;
            l.name = w.name;
            l.launches = 0;
            l.blocks = 0;
            l.threads_per_block = static_cast<std::size_t>(w.block.x) * w.block.y * w.block.z;
            l.shared_bytes = w.shared_bytes;
            const auto r = ptxas_registers().find(without_anonymous_names(w.symbol));
            if (!w.symbol.empty() && r != ptxas_registers().end()) l.registers_per_thread = r->second;
            out.push_back(l);
            it = out.end() - 1;
        }
        it->launches += 1;
        it->blocks += blocks;
        it->bytes_read += static_cast<double>(w.bytes_read);
        it->bytes_written += static_cast<double>(w.bytes_written);
        it->fp32_flops += w.fp32_flops;
        it->tf32_flops += w.tf32_flops;
        it->f16_flops += w.f16_flops;
    }
    return out;
}
#else
bool count_work(bool) { return false; }
std::vector<roofline::Launch> take_counted_work(bool* all_counted) {
    if (all_counted) *all_counted = false;
    return {};
}
#endif

}  // namespace attn::cuda
