#pragma once
// The trained model as one file other runs and tools compare: its parameters and buffers by
// name, a pickled dict (torch.load, torch::pickle_load).

#include <filesystem>

namespace trainyard {

class Strategy;

// Collective with sharded strategies, which gather their parameters: every rank calls it, rank 0
// writes `file`.
void export_final_model(const Strategy& strategy, int rank, const std::filesystem::path& file);

}  // namespace trainyard
