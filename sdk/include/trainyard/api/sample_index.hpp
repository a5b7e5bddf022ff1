#pragma once
// The name under which a streaming split may give each sample's index in the split.

namespace trainyard {

// A [batch] long tensor once collated, so that a run can record which samples it trained on
// (run.step_record_file); the runtime removes it before the batch reaches the model. Map-style
// splits need none: the loader knows their indices.
inline constexpr const char* kSampleIndexKey = "sample_index";

}  // namespace trainyard
