// The SDK and the host name no device type, vendor or vendor library: everything that depends on
// the kind of device or collective library goes through the device and comm plugin interfaces.
// A file that must name one anyway is listed below with the reason.

#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

// file (relative to the repository) -> why it may name a device type or vendor.
const std::map<std::string, std::string> kAllowed = {
    {"sdk/src/runtime/checkpoint_store.cpp",
     "checkpoint staging asks LibTorch whether a source tensor is a CUDA tensor to choose pinned "
     "host memory (checkpoint code, kept as it is)"},
};

// Names that are always a vendor's, matched in any case anywhere in a word.
const std::vector<std::string> kLongNames = {"cuda",   "cudnn", "cublas", "nccl", "rccl",
                                             "nvidia", "nvml",  "rocm",   "gloo", "oneccl"};
// Short device-type names, matched only as a word of their own, in lower or upper case
// (is_xpu, kMPS, "hip"), so that "ship" or "chip" do not count.
const std::vector<std::string> kShortNames = {"hip",  "xpu", "mps", "hpu", "npu",
                                              "mtia", "xla", "mlu", "tpu", "metal"};

std::string lower(std::string text) {
  for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// Whether `name` (lower case) occurs in `line` as a word: not continued by a letter of the same
// case on either side.
bool names_word(const std::string& line, const std::string& name) {
  std::string upper = name;
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const bool upper_case : {false, true}) {
    const std::string& spelling = upper_case ? upper : name;
    auto same_case_letter = [&](char c) {
      return upper_case ? std::isupper(static_cast<unsigned char>(c)) != 0
                        : std::islower(static_cast<unsigned char>(c)) != 0;
    };
    for (auto at = line.find(spelling); at != std::string::npos; at = line.find(spelling, at + 1)) {
      const bool starts = at == 0 || !same_case_letter(line[at - 1]);
      const std::size_t end = at + spelling.size();
      const bool ends = end == line.size() || !same_case_letter(line[end]);
      if (starts && ends) return true;
    }
  }
  return false;
}

// The vendor or device-type name `line` uses, or empty.
std::string vendor_name_in(const std::string& line) {
  const std::string folded = lower(line);
  for (const auto& name : kLongNames) {
    if (folded.find(name) != std::string::npos) return name;
  }
  for (const auto& name : kShortNames) {
    if (names_word(line, name)) return name;
  }
  return {};
}

TEST(VendorNames, RecognisesTheNamesItLooksFor) {
  EXPECT_EQ(vendor_name_in("if (device.is_cuda())"), "cuda");
  EXPECT_EQ(vendor_name_in("c10::DeviceType::CUDA"), "cuda");
  EXPECT_EQ(vendor_name_in("\"nccl\""), "nccl");
  EXPECT_EQ(vendor_name_in("at::kXPU"), "xpu");
  EXPECT_EQ(vendor_name_in("tensor.is_mps()"), "mps");
  EXPECT_EQ(vendor_name_in("a HIP build"), "hip");
  EXPECT_EQ(vendor_name_in("the relationship of a chip to its ship"), "");
  EXPECT_EQ(vendor_name_in("the host cpu"), "");
}

TEST(VendorNames, SdkAndHostNameNoDeviceTypeOrVendor) {
  const fs::path root = testing::source_dir();
  std::vector<std::string> findings;
  std::size_t files = 0;
  for (const char* folder : {"sdk", "host"}) {
    for (const auto& item : fs::recursive_directory_iterator(root / folder)) {
      if (!item.is_regular_file()) continue;
      const std::string extension = item.path().extension().string();
      if (extension != ".cpp" && extension != ".hpp" && extension != ".txt" &&
          extension != ".cmake" && extension != ".in") {
        continue;
      }
      ++files;
      const std::string relative = fs::relative(item.path(), root).generic_string();
      if (kAllowed.count(relative)) continue;
      std::ifstream in(item.path());
      std::string line;
      for (int number = 1; std::getline(in, line); ++number) {
        const std::string name = vendor_name_in(line);
        if (!name.empty()) {
          findings.push_back(relative + ":" + std::to_string(number) + ": names '" + name +
                             "': " + line);
        }
      }
    }
  }
  EXPECT_GT(files, 50u) << "the sources were not found under " << root;
  std::string report;
  for (const auto& finding : findings) report += finding + "\n";
  EXPECT_TRUE(findings.empty())
      << "move device- or vendor-specific code behind the device or comm plugin interfaces "
         "(or allow the file in "
      << __FILE__ << " with the reason):\n"
      << report;
}

TEST(VendorNames, EveryAllowedFileStillNamesOne) {
  const fs::path root = testing::source_dir();
  for (const auto& [file, reason] : kAllowed) {
    std::ifstream in(root / file);
    ASSERT_TRUE(in) << file << " no longer exists; drop it from the allow-list";
    std::string line;
    bool names = false;
    while (std::getline(in, line)) names = names || !vendor_name_in(line).empty();
    EXPECT_TRUE(names) << file << " names no vendor any more; drop it from the allow-list";
  }
}

}  // namespace
}  // namespace trainyard
