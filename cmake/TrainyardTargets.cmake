# Build helpers shared by the SDK, the host, the in-tree plugins and the tests.
#
# Sources include the narrow LibTorch headers they need, and ccache (with CCACHE_BASEDIR set by
# tools/build) shares objects between clones.

function(trainyard_warnings target)
  target_compile_options(${target} PRIVATE ${TRAINYARD_WARNINGS})
endfunction()

include("${PROJECT_SOURCE_DIR}/cmake/TrainyardPlugin.cmake")

# One precompiled header of the LibTorch headers most of our sources include, built once and
# reused by every target that compiles against LibTorch: parsing those headers is most of a
# source's 20 s compile, and loading the PCH takes 3 s. Not LibTorch's umbrella header (a 700 MB
# PCH that loads slower than it saves). GCC accepts a PCH only where -fpic matches, so the holder
# and every user compile position-independent (executables too: they still link as PIE). ccache
# caches these compiles with the sloppiness tools/build sets.
# On by default: a cold build of what running needs takes about 6 minutes with it instead of 10 on
# two cores. It does not change numerics: the golden loss curves match bit for bit with and without
# it. -DTRAINYARD_TORCH_PCH=OFF compiles each source alone.
option(TRAINYARD_TORCH_PCH "Compile LibTorch sources with one shared precompiled header" ON)
if(TRAINYARD_TORCH_PCH)
add_library(trainyard_torch_pch OBJECT "${PROJECT_SOURCE_DIR}/cmake/torch_pch.cpp")
target_link_libraries(trainyard_torch_pch PRIVATE torch)
set_target_properties(trainyard_torch_pch PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_precompile_headers(trainyard_torch_pch PRIVATE
  <ATen/ATen.h>
  <torch/nn/module.h>
  <torch/nn/modules/container/sequential.h>
  <torch/nn/modules/linear.h>
  <torch/optim/optimizer.h>
  <torch/csrc/autograd/function.h>
  <torch/csrc/distributed/c10d/Backend.hpp>)
trainyard_warnings(trainyard_torch_pch)
endif()

find_package(Python3 REQUIRED COMPONENTS Interpreter)

# trainyard_torch_pch(<target>): <target> compiles with the shared LibTorch PCH, except its
# sources whose includes never reach LibTorch (cmake/torch_free_sources.py): loading the PCH
# would cost them more than they take without it.
function(trainyard_torch_pch target)
  if(NOT TRAINYARD_TORCH_PCH)
    return()
  endif()
  target_precompile_headers(${target} REUSE_FROM trainyard_torch_pch)
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  set(absolute_sources)
  foreach(source IN LISTS sources)
    if(source MATCHES "[.]cpp$" AND NOT source MATCHES "^\\$<")
      cmake_path(ABSOLUTE_PATH source BASE_DIRECTORY "${source_dir}" OUTPUT_VARIABLE absolute)
      list(APPEND absolute_sources "${absolute}")
    endif()
  endforeach()
  if(absolute_sources)
    set(include_dirs)
    foreach(dir sdk/include sdk/src/runtime tests/support tests/e2e tests/conformance)
      list(APPEND include_dirs --include-dir "${PROJECT_SOURCE_DIR}/${dir}")
    endforeach()
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/cmake/torch_free_sources.py"
              ${include_dirs} -- ${absolute_sources}
      OUTPUT_VARIABLE torch_free OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
    string(REPLACE "\n" ";" torch_free "${torch_free}")
    if(torch_free)
      set_source_files_properties(${torch_free} TARGET_DIRECTORY ${target}
        PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endif()
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    target_compile_options(${target} PRIVATE -fPIC)
  else()
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  endif()
endfunction()
