#pragma once
// File-system operations the runtime needs beyond std::filesystem.

#include <filesystem>
#include <string>

namespace trainyard {

// Removes `path` and everything below it; a missing path is not an error. Throws Error naming the
// entry that could not be removed.
//
// std::filesystem::remove_all is not used: LibTorch's shared library exports its own copy of
// several std::filesystem functions, and depending on symbol resolution order a process can bind
// to that copy, which crashes in remove_all.
void remove_tree(const std::filesystem::path& path);

// Flushes a file's (or a folder's entries') data to the disk; throws Error naming it on failure.
// A rename is durable only once the folder holding it has been synced.
void sync_to_disk(const std::filesystem::path& path);

// Writes `text` to `file` whole: into a file beside it, then renamed over it, so that a reader
// (a report made while or after a run writes) never sees half a file. Creates the folder holding
// it. Throws Error "<file>: cannot write <what>[: <reason>]" when it cannot.
void write_file_whole(const std::filesystem::path& file, const std::string& text,
                      const std::string& what);

}  // namespace trainyard
