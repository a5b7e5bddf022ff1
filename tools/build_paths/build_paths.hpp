#pragma once

// Where this build tree keeps its pieces, for the tests and benchmarks that run from it.
//
// The paths live in one generated translation unit instead of compile definitions: a definition
// that names the checkout would differ between clones and make every file that sees it miss the
// compiler cache, so a fresh clone would recompile all the tests.

namespace trainyard::build_paths {

const char* source_dir();          // the checkout
const char* binary_dir();          // the build tree
const char* plugin_dir();          // the bundled plugins, as built
const char* test_plugin_dir();     // the plugins only the tests load
const char* host_binary();         // build/bin/trainyard

}  // namespace trainyard::build_paths
