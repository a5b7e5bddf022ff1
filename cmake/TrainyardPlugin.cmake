# trainyard_add_plugin(<target> SOURCES <files...> [DESTINATION <folder>])
#
# Builds one plugin library against the trainyard SDK. Used by the in-tree plugins and, through
# find_package(trainyard), by plugins built out of tree, where `cmake --install` puts the library
# in DESTINATION: by default lib/trainyard/plugins under the install prefix (the installed host's
# plugin folder when the prefix is trainyard's own); "${TRAINYARD_PLUGIN_DIR}" names that folder
# whatever the prefix.
function(trainyard_add_plugin target)
  cmake_parse_arguments(PLUGIN "" "DESTINATION" "SOURCES" ${ARGN})
  add_library(${target} MODULE ${PLUGIN_SOURCES})
  target_link_libraries(${target} PRIVATE trainyard::sdk)
  set_target_properties(${target} PROPERTIES PREFIX "lib" CXX_VISIBILITY_PRESET hidden)
  if(COMMAND trainyard_warnings)
    # In trainyard's own build: beside the host in the build tree, and in the install.
    trainyard_warnings(${target})
    trainyard_torch_pch(${target})
    set_target_properties(${target} PROPERTIES
      LIBRARY_OUTPUT_DIRECTORY "${TRAINYARD_PLUGIN_OUTPUT_DIR}"
      INSTALL_RPATH "$ORIGIN/../..;${TRAINYARD_TORCH_LIBDIR}")
    install(TARGETS ${target} LIBRARY DESTINATION "${TRAINYARD_PLUGIN_INSTALL_DIR}")
    set_property(GLOBAL APPEND PROPERTY TRAINYARD_PLUGIN_TARGETS ${target})
  else()
    # Out of tree: the SDK library is found beside the plugin when it is installed in
    # trainyard's plugin folder ($ORIGIN/../..), else in the trainyard install it was built
    # against; LibTorch where that install's host finds it.
    if(NOT PLUGIN_DESTINATION)
      set(PLUGIN_DESTINATION "${TRAINYARD_PLUGIN_INSTALL_DIR}")
    endif()
    set_target_properties(${target} PROPERTIES
      INSTALL_RPATH "$ORIGIN/../..;${TRAINYARD_LIBRARY_DIR};${TRAINYARD_TORCH_LIBDIR}")
    install(TARGETS ${target} LIBRARY DESTINATION "${PLUGIN_DESTINATION}")
  endif()
endfunction()
