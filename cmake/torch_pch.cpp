// The translation unit that builds the shared LibTorch precompiled header
// (cmake/TrainyardTargets.cmake); it has no code of its own.
