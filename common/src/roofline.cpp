// The roofline bound and occupancy of attn/roofline.hpp.
#include "attn/roofline.hpp"

#include <algorithm>
#include <cstdio>

namespace attn::roofline {

Bound bound(const Launch& l, const Gpu& gpu) {
    Bound b;
    b.memory_seconds = (l.bytes_read + l.bytes_written) / gpu.memory_bytes;
    b.compute_seconds = l.fp32_flops / gpu.fp32_flops + l.tf32_flops / gpu.tf32_flops +
                        l.f16_flops / gpu.f16_flops;
    b.seconds = std::max(b.memory_seconds, b.compute_seconds);
    b.memory_limited_seconds = b.memory_seconds >= b.compute_seconds ? b.seconds : 0.0;
    return b;
}

Bound bound(const std::vector<Launch>& launches, const Gpu& gpu) {
    Bound total;
    for (const Launch& l : launches) {
        const Bound b = bound(l, gpu);  // one after another: each takes its own longer limit
        total.memory_seconds += b.memory_seconds;
        total.compute_seconds += b.compute_seconds;
        total.seconds += b.seconds;
        total.memory_limited_seconds += b.memory_limited_seconds;
    }
    return total;
}

Occupancy occupancy(const Launch& l, const Gpu& gpu) {
    Occupancy o;
    const std::size_t warps = (l.threads_per_block + 31) / 32;
    if (warps == 0 || l.threads_per_block > 1024) {
        o.limited_by = "no block fits (over 1 024 threads)";
        return o;
    }
    struct Limit {
        std::size_t blocks;
        const char* what;
    };
    std::vector<Limit> limits = {
        {static_cast<std::size_t>(gpu.max_blocks_per_sm), "blocks"},
        {static_cast<std::size_t>(gpu.max_warps_per_sm) / warps, "threads"},
    };
    if (l.registers_per_thread > gpu.max_registers_per_thread) {
        o.limited_by = "no block fits (over 255 registers a thread)";
        return o;
    }
    if (l.registers_per_thread > 0) {
        const std::size_t unit = static_cast<std::size_t>(gpu.register_unit);
        const std::size_t per_warp = (static_cast<std::size_t>(l.registers_per_thread) * 32 + unit - 1) / unit * unit;
        limits.push_back({static_cast<std::size_t>(gpu.registers_per_sm) / per_warp / warps, "registers"});
    }
    if (l.shared_bytes > 0) {
        const std::size_t per_block =
            (l.shared_bytes + gpu.shared_unit - 1) / gpu.shared_unit * gpu.shared_unit + gpu.shared_reserved_per_block;
        limits.push_back({gpu.shared_per_sm / per_block, "shared memory"});
    }
    const auto least = std::min_element(limits.begin(), limits.end(),
                                        [](const Limit& a, const Limit& b) { return a.blocks < b.blocks; });
    o.blocks_per_sm = static_cast<int>(least->blocks);
    o.limited_by = least->blocks == 0 ? std::string("no block fits (") + least->what + ")" : least->what;
    if (o.blocks_per_sm == 0) return o;
    o.warps_fraction = static_cast<double>(o.blocks_per_sm * warps) / gpu.max_warps_per_sm;
    o.waves = static_cast<double>(l.blocks) / (static_cast<double>(gpu.multiprocessors) * o.blocks_per_sm);
    return o;
}

std::vector<Launch> attention_forward_model(const AttentionShape& s, bool fused, int element_bytes,
                                            bool tensor_cores) {
    const double heads = static_cast<double>(s.B * s.NH), T = static_cast<double>(s.T),
                 hs = static_cast<double>(s.hs), qkv = 4.0 * heads * T * hs, scores = 4.0 * heads * T * T;
    if (fused) {
        Launch l;
        l.name = tensor_cores ? "wmma_attention_kernel" : "flash_forward_kernel";
        const double elements = qkv / 4 * element_bytes;
        l.bytes_read = 3 * elements;
        l.bytes_written = elements + 4.0 * heads * T;
        const double flops = 4.0 * hs * heads * (s.causal ? T * (T + 1) / 2 : T * T);
        (tensor_cores ? l.f16_flops : l.fp32_flops) = flops;
        return {l};
    }
    Launch scores_product, softmax, values_product;
    scores_product.name = "q kᵀ (cuBLAS)";
    scores_product.bytes_read = 2 * qkv;
    scores_product.bytes_written = scores;
    scores_product.fp32_flops = 2.0 * heads * T * T * hs;
    softmax.name = "softmax_forward_kernel";
    softmax.bytes_read = scores;
    softmax.bytes_written = scores;
    values_product.name = "P v (cuBLAS)";
    values_product.bytes_read = scores + qkv;
    values_product.bytes_written = qkv;
    values_product.fp32_flops = 2.0 * heads * T * T * hs;
    return {scores_product, softmax, values_product};
}

std::string table(std::vector<Launch> launches, std::size_t rows, const Gpu& gpu) {
    std::stable_sort(launches.begin(), launches.end(), [&gpu](const Launch& a, const Launch& b) {
        return bound(a, gpu).seconds > bound(b, gpu).seconds;
    });
    std::string out;
    char line[256];
    std::snprintf(line, sizeof line, "%-34s %5s %9s %9s %8s %9s %8s  %s\n", "kernel or call", "n", "MiB read",
                  "MiB writ.", "GFLOP", "bound µs", "limit", "blocks/SM (limit), registers");
    out += line;
    const auto row = [&](const std::string& name, std::size_t n, double read, double written, double flops,
                         const Bound& b, const std::string& occupancy_text) {
        std::snprintf(line, sizeof line, "%-34.34s %5zu %9.3f %9.3f %8.3f %9.2f %8s  %s\n", name.c_str(), n,
                      read / (1 << 20), written / (1 << 20), flops / 1e9, b.seconds * 1e6, b.limited_by(),
                      occupancy_text.c_str());
        out += line;
    };
    std::vector<Launch> rest;
    for (std::size_t i = 0; i < launches.size(); ++i) {
        const Launch& l = launches[i];
        if (i >= rows) {
            rest.push_back(l);
            continue;
        }
        std::string occupancy_text = "-";
        if (l.name.rfind("cublas", 0) != 0) {
            const Occupancy o = occupancy(l, gpu);
            occupancy_text = std::to_string(o.blocks_per_sm) + " (" + o.limited_by + "), " +
                             (l.registers_per_thread > 0 ? std::to_string(l.registers_per_thread) : "?") + " regs";
        }
        row(l.name, l.launches, l.bytes_read, l.bytes_written, l.fp32_flops + l.tf32_flops + l.f16_flops,
            bound(l, gpu), occupancy_text);
    }
    const auto sum = [&](const std::vector<Launch>& group, const std::string& name) {
        std::size_t n = 0;
        double read = 0, written = 0, flops = 0;
        for (const Launch& l : group) {
            n += l.launches;
            read += l.bytes_read;
            written += l.bytes_written;
            flops += l.fp32_flops + l.tf32_flops + l.f16_flops;
        }
        row(name, n, read, written, flops, bound(group, gpu), "");
    };
    if (!rest.empty()) sum(rest, "(" + std::to_string(rest.size()) + " more kernels)");
    sum(launches, "in all");
    return out;
}

}  // namespace attn::roofline
