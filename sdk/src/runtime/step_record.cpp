#include "step_record.hpp"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "trainyard/api/error.hpp"

namespace trainyard {

StepRecord::StepRecord(const std::filesystem::path& file) : file_(file) {
  std::error_code error;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), error);
  out_.open(file, std::ios::out | std::ios::trunc);
  if (!out_) throw Error("run.step_record_file: cannot write " + file.string());
}

void StepRecord::write(std::int64_t step, double learning_rate, double loss,
                       const std::vector<std::vector<std::int64_t>>& micro_batch_indices) {
  std::ostringstream line;
  // 17 significant digits: the doubles read back bit for bit.
  line << std::setprecision(17) << "{\"step\": " << step << ", \"lr\": " << learning_rate
       << ", \"loss\": ";
  // JSON has no NaN or infinity: a non-finite loss is null, and nonfinite_loss spells which
  // (as Python's float() reads it), so every line stays valid JSON for any reader.
  if (std::isfinite(loss)) {
    line << loss;
  } else {
    line << "null, \"nonfinite_loss\": \""
         << (std::isnan(loss) ? "NaN" : (loss > 0 ? "Infinity" : "-Infinity")) << "\"";
  }
  line << ", \"indices\": [";
  for (std::size_t m = 0; m < micro_batch_indices.size(); ++m) {
    line << (m ? ", [" : "[");
    for (std::size_t i = 0; i < micro_batch_indices[m].size(); ++i) {
      line << (i ? ", " : "") << micro_batch_indices[m][i];
    }
    line << "]";
  }
  line << "]}\n";
  out_ << line.str() << std::flush;
  if (!out_) throw Error("run.step_record_file: cannot write " + file_.string());
}

}  // namespace trainyard
