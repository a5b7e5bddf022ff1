#pragma once
// An image folder as torchvision's ImageFolder reads one: one subfolder per class, the classes
// sorted by name (label = position), the images under each (any depth) sorted by path, files
// ending .jpg, .jpeg or .png (any case). Every file is checked at the start, so that an unreadable
// one is found before training rather than hours into it: its header, a JPEG's end-of-image
// marker, a PNG's chunk CRCs.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace trainyard {

struct ImageSample {
  std::filesystem::path path;
  std::int64_t label = 0;
};

struct ScannedFolder {
  std::vector<std::string> classes;
  std::vector<ImageSample> samples;
  // Files left out with on_bad_sample = "skip", each "path: why" (also reported to the run
  // summary through report_skipped_sample).
  std::vector<std::string> skipped;
  // The first readable image's size and channels, as stored.
  std::int64_t height = 0;
  std::int64_t width = 0;
  std::int64_t channels = 0;
};

// Throws Error naming the path for a missing folder, a folder without class subfolders, a class
// without images, and (unless `skip_bad`) a file whose header does not read.
ScannedFolder scan_image_folder(const std::filesystem::path& root, bool skip_bad);

}  // namespace trainyard
