# One static library per layer, each linked only to the layers below it, and each compiled with
# one include root of its own that holds just the folders it may include (symbolic links to
# them, made at configure time in ${CMAKE_BINARY_DIR}/include-roots/<layer>). So a file that
# includes a higher layer does not compile: "io/h5.hpp: No such file or directory" in a kernel.
# docs/design.md, "Layers", draws the map; tests/python/test_layers.py says the same in a test.
#
#   qstage_layer(NAME
#     SOURCES files...
#     SEES    name=path ...   what the include root holds: "core=src/core" makes
#                             #include "core/x.hpp" find src/core/x.hpp; a path may be a file
#     LINKS   targets...)     the layers below and the libraries this layer calls (PUBLIC)

# The include root of `target`: "name=path" entries become links name -> path in it.
function(qstage_include_root target)
  set(root ${CMAKE_BINARY_DIR}/include-roots/${target})
  file(REMOVE_RECURSE ${root})
  foreach(entry IN LISTS ARGN)
    string(REPLACE "=" ";" pair "${entry}")
    list(GET pair 0 link)
    list(GET pair 1 path)
    get_filename_component(parent ${root}/${link} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/${path} ${root}/${link} SYMBOLIC)
  endforeach()
  target_include_directories(${target} PRIVATE ${root})
endfunction()

function(qstage_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;SEES;LINKS" ${ARGN})
  add_library(${name} STATIC ${L_SOURCES})
  qstage_include_root(${name} ${L_SEES})
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
