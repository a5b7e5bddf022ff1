#pragma once
// An image folder as torchvision's ImageFolder reads one, or a list of images and labels: one
// subfolder per class, the classes sorted by name (label = position), the images under each (any
// depth) sorted by path, files ending .jpg, .jpeg or .png (any case). Every file is checked at the
// start, so that an unreadable one is found before training rather than hours into it: its header,
// a JPEG's end-of-image marker, a PNG's chunk CRCs.

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
};

// Throws Error naming the path for a missing folder, a folder without class subfolders, a class
// without images, and (unless `skip_bad`) a file whose header does not read.
ScannedFolder scan_image_folder(const std::filesystem::path& root, bool skip_bad);

// True for a .csv or .json file: a list of images rather than a folder of class folders.
bool is_image_list(const std::filesystem::path& path);

// A list of images and their labels, as scan_image_folder checks a folder: a CSV of "path,label"
// lines (a "path,label" header line is allowed; the label follows the last comma) or a JSON
// array of {"path": ..., "label": ...}; paths relative to the list's folder; labels integers
// from 0, the classes 0 .. the largest label. Throws Error naming the list and line (or entry)
// for a malformed one, and the file for an unreadable image (unless `skip_bad`).
ScannedFolder scan_image_list(const std::filesystem::path& list, bool skip_bad);

}  // namespace trainyard
