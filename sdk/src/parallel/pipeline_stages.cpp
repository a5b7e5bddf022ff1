#include "trainyard/parallel/pipeline_stages.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "trainyard/api/error.hpp"

#include <utility>

namespace trainyard {
namespace {

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return {};
  const auto last = text.find_last_not_of(" \t");
  return text.substr(first, last - first + 1);
}

std::vector<std::string> split_names(const std::string& stage) {
  std::vector<std::string> names;
  std::size_t start = 0;
  while (true) {
    const auto comma = stage.find(',', start);
    names.push_back(trim(stage.substr(start, comma == std::string::npos ? comma : comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return names;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

std::vector<BlockRange> named_stages(const std::vector<std::string>& stages,
                                     const std::vector<std::string>& block_names, int stage_count) {
  if (static_cast<int>(stages.size()) != stage_count) {
    throw Error("pipeline: stages lists " + std::to_string(stages.size()) + " stages, but pp " +
                "x virtual_stages makes " + std::to_string(stage_count));
  }
  std::map<std::string, std::int64_t> index;
  for (std::size_t i = 0; i < block_names.size(); ++i) {
    index.emplace(block_names[i], static_cast<std::int64_t>(i));
  }
  std::vector<BlockRange> ranges;
  std::int64_t next = 0;  // the block the next name must be
  const auto count = static_cast<std::int64_t>(block_names.size());
  for (std::size_t s = 0; s < stages.size(); ++s) {
    const std::string where = "pipeline: stage " + std::to_string(s) + " ('" + stages[s] + "')";
    BlockRange range{next, next};
    for (const std::string& name : split_names(stages[s])) {
      if (name.empty()) throw Error(where + " has an empty block name");
      auto it = index.find(name);
      if (it == index.end()) {
        throw Error(where + " names block '" + name + "', which the model does not have (" +
                    join(block_names) + ")");
      }
      if (it->second != next) {
        throw Error(where + " names block '" + name + "' where block '" +
                    (next < count ? block_names[static_cast<std::size_t>(next)] : "(none)") +
                    "' comes next: stages list every block once, in forward order");
      }
      range.end = ++next;
    }
    ranges.push_back(range);
  }
  if (next != count) {
    throw Error("pipeline: stages leave out block '" + block_names[static_cast<std::size_t>(next)] +
                "' and those after it: stages list every block once, in forward order");
  }
  return ranges;
}

std::vector<BlockRange> balanced_stages(const std::vector<double>& block_costs, int stage_count) {
  const auto n = static_cast<std::int64_t>(block_costs.size());
  if (stage_count < 1) throw Error("pipeline: " + std::to_string(stage_count) + " stages");
  if (n < stage_count) {
    throw Error("pipeline: the model has " + std::to_string(n) + " blocks, fewer than the " +
                std::to_string(stage_count) + " stages (pp x virtual_stages) to cut it into");
  }
  for (double cost : block_costs) {
    if (!std::isfinite(cost) || cost < 0) {
      throw Error("pipeline: a block cost of " + std::to_string(cost) + " cannot be balanced");
    }
  }
  std::vector<double> prefix(static_cast<std::size_t>(n) + 1, 0.0);
  for (std::int64_t i = 0; i < n; ++i) {
    prefix[static_cast<std::size_t>(i) + 1] =
        prefix[static_cast<std::size_t>(i)] + block_costs[static_cast<std::size_t>(i)];
  }
  auto cost = [&](std::int64_t begin, std::int64_t end) {
    return prefix[static_cast<std::size_t>(end)] - prefix[static_cast<std::size_t>(begin)];
  };
  // best[k][i]: the smallest largest-stage cost of cutting blocks [0, i) into k stages; the
  // linear partition problem, exact by dynamic programming (blocks and stages are few).
  const double inf = std::numeric_limits<double>::infinity();
  const auto width = static_cast<std::size_t>(n) + 1;
  std::vector<std::vector<double>> best(static_cast<std::size_t>(stage_count) + 1,
                                        std::vector<double>(width, inf));
  std::vector<std::vector<std::int64_t>> cut(static_cast<std::size_t>(stage_count) + 1,
                                             std::vector<std::int64_t>(width, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stage_count; ++k) {
    for (std::int64_t i = k; i <= n; ++i) {
      for (std::int64_t j = k - 1; j < i; ++j) {
        const double candidate = std::max(
            best[static_cast<std::size_t>(k) - 1][static_cast<std::size_t>(j)], cost(j, i));
        if (candidate < best[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)]) {
          best[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)] = candidate;
          cut[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)] = j;
        }
      }
    }
  }
  std::vector<BlockRange> ranges(static_cast<std::size_t>(stage_count));
  std::int64_t end = n;
  for (int k = stage_count; k >= 1; --k) {
    const std::int64_t begin = cut[static_cast<std::size_t>(k)][static_cast<std::size_t>(end)];
    ranges[static_cast<std::size_t>(k) - 1] = BlockRange{begin, end};
    end = begin;
  }
  return ranges;
}

std::vector<std::string> describe_stages(const std::vector<BlockRange>& stages,
                                         const std::vector<std::string>& block_names,
                                         const std::vector<double>& block_costs) {
  double total = 0;
  for (double cost : block_costs) total += cost;
  std::vector<std::string> lines;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    const BlockRange& range = stages[s];
    const std::int64_t blocks = range.end - range.begin;
    std::string line =
        "stage " + std::to_string(s) + ": " + block_names[static_cast<std::size_t>(range.begin)];
    if (blocks > 1) line += ".." + block_names[static_cast<std::size_t>(range.end) - 1];
    line += " (" + std::to_string(blocks) + (blocks == 1 ? " block" : " blocks");
    if (!block_costs.empty() && total > 0) {
      double cost = 0;
      for (std::int64_t b = range.begin; b < range.end; ++b) {
        cost += block_costs[static_cast<std::size_t>(b)];
      }
      char share[48];
      std::snprintf(share, sizeof share, ", %.1f%% of the cost", 100.0 * cost / total);
      line += share;
    }
    lines.push_back(line + ")");
  }
  return lines;
}

std::string stage_cut_key(const std::vector<BlockRange>& stages,
                          const std::vector<std::string>& block_names) {
  std::string key = "stages ";
  for (std::size_t s = 0; s < stages.size(); ++s) {
    if (s > 0) key += "|";
    for (std::int64_t b = stages[s].begin; b < stages[s].end; ++b) {
      if (b > stages[s].begin) key += ",";
      key += block_names[static_cast<std::size_t>(b)];
    }
  }
  return key;
}

std::vector<double> stage_balancing_costs(std::vector<double> block_flops,
                                          std::vector<double> block_parameters) {
  double total = 0;
  for (double flops : block_flops) total += flops;
  return total > 0 ? std::move(block_flops) : std::move(block_parameters);
}

}  // namespace trainyard
