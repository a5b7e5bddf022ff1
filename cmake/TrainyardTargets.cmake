# Build helpers shared by the SDK, the host, the in-tree plugins and the tests.
#
# No precompiled header: LibTorch's umbrella header makes a 700 MB PCH whose loading costs more
# than it saves, and ccache cannot cache PCH builds. Sources include the narrow LibTorch headers
# they need instead, and ccache (with CCACHE_BASEDIR set by tools/build) shares objects between
# clones.

function(trainyard_warnings target)
  target_compile_options(${target} PRIVATE ${TRAINYARD_WARNINGS})
endfunction()

include("${PROJECT_SOURCE_DIR}/cmake/TrainyardPlugin.cmake")
