# The layers of meshfuse (DESIGN.md "Layers", docs/architecture.md), one static library each,
# linked in this order: a layer may use the layers before it, never one after it.
#
# The rule is enforced by include paths, not by review: each layer compiles with ONE include
# directory, build/layers/<layer>/, a tree of symbolic links to the source directories of that
# layer and the layers below it (`lower/host_ir.h`, `propagation/sharding.h`, ...) and to the
# public headers those layers own (`meshfuse/...`). A header of a higher layer is simply not
# there: an upward include fails to build ("No such file or directory"). tests/scripts/layer_dag.sh
# proves it with the real compile commands.
#
# Front ends, tests, examples and benchmarks sit on top: they see `include/` and `src/` whole.

set(MESHFUSE_LAYERS ir autodiff propagation decompose lower codegen runtime driver)

# The public headers (include/meshfuse, the user API) and the layer that owns each. Every file
# or directory there must be listed (checked below), so a new public header states its layer.
set(MESHFUSE_PUBLIC_ir ir error.h ops.h options.h)
set(MESHFUSE_PUBLIC_autodiff autodiff.h optimizer.h)
set(MESHFUSE_PUBLIC_propagation)
set(MESHFUSE_PUBLIC_decompose)
set(MESHFUSE_PUBLIC_lower)
set(MESHFUSE_PUBLIC_codegen)
set(MESHFUSE_PUBLIC_runtime tensor.h npy.h communicator.h trace.h)
set(MESHFUSE_PUBLIC_driver executor.h training_executor.h reference.h grad_check.h)

set(_mf_listed "")
foreach(layer IN LISTS MESHFUSE_LAYERS)
  list(APPEND _mf_listed ${MESHFUSE_PUBLIC_${layer}})
endforeach()
file(GLOB _mf_public RELATIVE ${PROJECT_SOURCE_DIR}/include/meshfuse CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/include/meshfuse/*)
foreach(entry IN LISTS _mf_public)
  if(NOT entry IN_LIST _mf_listed)
    message(FATAL_ERROR "include/meshfuse/${entry} belongs to no layer: add it to a MESHFUSE_PUBLIC_<layer> list in cmake/MeshfuseLayers.cmake")
  endif()
endforeach()

# build/layers/<layer>/: links to what `layer` may include.
set(_mf_below "")
foreach(layer IN LISTS MESHFUSE_LAYERS)
  list(APPEND _mf_below ${layer})
  set(dir ${PROJECT_BINARY_DIR}/layers/${layer})
  file(REMOVE_RECURSE ${dir})
  file(MAKE_DIRECTORY ${dir}/meshfuse)
  foreach(visible IN LISTS _mf_below)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${visible} ${dir}/${visible} SYMBOLIC)
    foreach(header IN LISTS MESHFUSE_PUBLIC_${visible})
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/meshfuse/${header} ${dir}/meshfuse/${header} SYMBOLIC)
    endforeach()
  endforeach()
  set(MESHFUSE_LAYER_INCLUDE_${layer} ${dir})
endforeach()

# meshfuse_<layer>: the layer's sources (globbed from its directories), its include tree, and
# the layer below it as a public dependency (so linking a layer links everything it stands on).
function(meshfuse_add_layer layer)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "" "SOURCES")
  add_library(meshfuse_${layer} STATIC ${ARG_SOURCES})
  target_include_directories(meshfuse_${layer} PRIVATE ${MESHFUSE_LAYER_INCLUDE_${layer}})
  list(FIND MESHFUSE_LAYERS ${layer} index)
  if(index GREATER 0)
    math(EXPR below "${index} - 1")
    list(GET MESHFUSE_LAYERS ${below} below_layer)
    target_link_libraries(meshfuse_${layer} PUBLIC meshfuse_${below_layer})
  endif()
endfunction()
