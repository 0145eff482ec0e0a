# One static library per layer, each linked only to the layers below it, and each compiled with
# one include root of its own that holds just the folders it may include (symbolic links to
# them, made at configure time in ${CMAKE_BINARY_DIR}/include-roots/<target>). So a file that
# includes a higher layer does not compile: "io/h5.hpp: No such file or directory" in a kernel.
# The layer table is cmake/layers.json, read here and by tests/python/test_layers.py; the
# folders are the include paths the code writes ("core/x.hpp" is core/x.hpp).
#
#   qstage_layer(TARGET LAYER          LAYER: a name in cmake/layers.json
#     SOURCES files...
#     LINKS   targets...)              the layers below and the libraries this layer calls (PUBLIC)

set(QSTAGE_LAYERS_JSON ${CMAKE_SOURCE_DIR}/cmake/layers.json)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${QSTAGE_LAYERS_JSON})
file(READ ${QSTAGE_LAYERS_JSON} QSTAGE_LAYERS)

# The index of layer `name` in the table, or -1.
function(qstage_layer_index name out)
  string(JSON count LENGTH "${QSTAGE_LAYERS}" layers)
  math(EXPR last "${count} - 1")
  foreach(i RANGE ${last})
    string(JSON n GET "${QSTAGE_LAYERS}" layers ${i} name)
    if(n STREQUAL name)
      set(${out} ${i} PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} -1 PARENT_SCOPE)
endfunction()

# What layer `name` may include: its folders, and for each entry it sees, that layer's (by name,
# recursively) or that path.
function(qstage_layer_paths name out)
  qstage_layer_index(${name} i)
  if(i LESS 0)
    message(FATAL_ERROR "cmake/layers.json has no layer '${name}'")
  endif()
  set(paths)
  string(JSON n LENGTH "${QSTAGE_LAYERS}" layers ${i} folders)
  if(n GREATER 0)
    math(EXPR last "${n} - 1")
    foreach(k RANGE ${last})
      string(JSON folder GET "${QSTAGE_LAYERS}" layers ${i} folders ${k})
      list(APPEND paths ${folder})
    endforeach()
  endif()
  string(JSON n LENGTH "${QSTAGE_LAYERS}" layers ${i} sees)
  if(n GREATER 0)
    math(EXPR last "${n} - 1")
    foreach(k RANGE ${last})
      string(JSON seen GET "${QSTAGE_LAYERS}" layers ${i} sees ${k})
      qstage_layer_index(${seen} j)
      if(j LESS 0)
        list(APPEND paths ${seen})
      else()
        qstage_layer_paths(${seen} below)
        list(APPEND paths ${below})
      endif()
    endforeach()
  endif()
  list(REMOVE_DUPLICATES paths)
  set(${out} ${paths} PARENT_SCOPE)
endfunction()

# The include root of `target`: a link to each path (a folder or a file) under its own name.
function(qstage_include_root target)
  set(root ${CMAKE_BINARY_DIR}/include-roots/${target})
  file(REMOVE_RECURSE ${root})
  foreach(path IN LISTS ARGN)
    # (a path inside a folder the root links already is there: "core/hd.hpp" beside "core")
    set(covered FALSE)
    foreach(other IN LISTS ARGN)
      string(FIND "${path}" "${other}/" at)
      if(at EQUAL 0)
        set(covered TRUE)
      endif()
    endforeach()
    if(covered)
      continue()
    endif()
    get_filename_component(parent ${root}/${path} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/${path} ${root}/${path} SYMBOLIC)
  endforeach()
  target_include_directories(${target} PRIVATE ${root})
endfunction()

# The include root of `target` built from layer `layer` of the table.
function(qstage_layer_include_root target layer)
  qstage_layer_paths(${layer} paths)
  qstage_include_root(${target} ${paths})
endfunction()

function(qstage_layer name layer)
  cmake_parse_arguments(L "" "" "SOURCES;LINKS" ${ARGN})
  add_library(${name} STATIC ${L_SOURCES})
  qstage_layer_include_root(${name} ${layer})
  # The generated core/build_info.hpp and embedded files.
  target_include_directories(${name} PRIVATE ${CMAKE_BINARY_DIR}/generated)
  target_link_libraries(${name} PUBLIC ${L_LINKS})
  target_compile_options(${name} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter
    # GCC 12 reports a false -Wrestrict inside libstdc++ string concatenation (GCC bug 105329).
    -Wno-restrict>)
  if(QSTAGE_HAVE_CUDA)
    target_compile_definitions(${name} PUBLIC QSTAGE_HAVE_CUDA=1)
    set_target_properties(${name} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
    target_compile_options(${name} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-fopenmp
        # the host compiler's warnings as for .cpp files, and nvcc's own for device code
        -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter -Wreorder --Wext-lambda-captures-this>)
  endif()
endfunction()
