# trainyard_add_plugin(<target> SOURCES <files...>)
#
# Builds one plugin library against the trainyard SDK. Used by the in-tree plugins and, through
# find_package(trainyard), by plugins built out of tree.
function(trainyard_add_plugin target)
  cmake_parse_arguments(PLUGIN "" "" "SOURCES" ${ARGN})
  add_library(${target} MODULE ${PLUGIN_SOURCES})
  target_link_libraries(${target} PRIVATE trainyard::sdk)
  set_target_properties(${target} PROPERTIES PREFIX "lib" CXX_VISIBILITY_PRESET hidden)
  if(COMMAND trainyard_warnings)
    trainyard_warnings(${target})
    set_target_properties(${target} PROPERTIES
      LIBRARY_OUTPUT_DIRECTORY "${TRAINYARD_PLUGIN_OUTPUT_DIR}"
      INSTALL_RPATH "$ORIGIN/../..;${TRAINYARD_TORCH_LIBDIR}")
    install(TARGETS ${target} LIBRARY DESTINATION "${TRAINYARD_PLUGIN_INSTALL_DIR}")
    set_property(GLOBAL APPEND PROPERTY TRAINYARD_PLUGIN_TARGETS ${target})
  endif()
endfunction()
