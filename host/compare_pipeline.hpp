#pragma once
// The compare page's pipeline schedule sections: per variant that declared a schedule, its
// simulated schedule and, when its run recorded one, the measured timeline. pipeline_variant and
// format_pipeline_idle_shares, declared in compare_report.hpp, live with them.

#include <string>
#include <vector>

#include "compare_report.hpp"

namespace trainyard {

// The page's "Pipeline schedules" heading and one section per pipeline variant; empty when no
// variant declared a schedule.
std::string pipeline_sections(const std::vector<VariantResult>& variants);

}  // namespace trainyard
