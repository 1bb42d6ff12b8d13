# The build's side of inner/torch_compat.h: what differs between the libtorch releases atoll
# builds against (Debian 12's CPU 1.13, Debian 13's 2.6, PyPI's CUDA 2.11) and between the CUDA
# toolkits beside them (/usr/local/cuda, or NVIDIA's wheels: nvidia-cuda-nvcc and friends under
# site-packages/nvidia/cu13). The top-level CMakeLists.txt calls these two functions and nothing
# else there tests a torch or CUDA version.

# Before enable_language(CUDA): a CUDA toolkit laid out as NVIDIA's wheels lay it out (libraries in
# lib/, not lib64/, and only as libcudart.so.13, libnvrtc.so.13: no unversioned development link)
# is made findable by the compiler checks, CMake's FindCUDAToolkit and libtorch's FindCUDA.
#   NVCC: the nvcc that will be CMAKE_CUDA_COMPILER
function(atoll_cuda_toolkit_layout nvcc)
  get_filename_component(nvcc "${nvcc}" REALPATH)
  get_filename_component(root "${nvcc}" DIRECTORY)
  get_filename_component(root "${root}" DIRECTORY)
  # libtorch's FindCUDA looks for its own nvcc (on PATH): the same toolkit.
  set(CUDA_TOOLKIT_ROOT_DIR "${root}" CACHE PATH "The CUDA toolkit of CMAKE_CUDA_COMPILER")
  if(EXISTS "${root}/lib64" OR NOT EXISTS "${root}/lib" OR EXISTS "${root}/lib/libcudart.so")
    return()  # a toolkit's own layout: nothing to do
  endif()
  message(STATUS "atoll: CUDA toolkit from NVIDIA's wheels at ${root}")
  # nvcc.profile links lib64/: its compiler checks and every CUDA link need lib/ too. The
  # environment reaches check_language's sub-build as well as this one's first CMAKE_CUDA_FLAGS.
  if(NOT "$ENV{CUDAFLAGS}" MATCHES "-L${root}/lib")
    set(ENV{CUDAFLAGS} "$ENV{CUDAFLAGS} -L${root}/lib")
  endif()
  # The development links a toolkit's packages carry (libcudart.so -> libcudart.so.13), made in the
  # build tree, where every later find_library (CMake's FindCUDAToolkit, libtorch's FindCUDA) looks;
  # beside them the sonames, which binaries linked there load through their run path.
  set(links "${CMAKE_BINARY_DIR}/cuda-dev-links")
  file(MAKE_DIRECTORY "${links}")
  foreach(lib cudart nvrtc)
    file(GLOB versioned "${root}/lib/lib${lib}.so.[0-9]*")
    list(FILTER versioned INCLUDE REGEX "\\.so\\.[0-9]+$")  # the soname, not libnvrtc.so.13.0
    if(versioned)
      list(GET versioned 0 versioned)
      get_filename_component(soname "${versioned}" NAME)
      file(CREATE_LINK "${versioned}" "${links}/lib${lib}.so" SYMBOLIC)
      file(CREATE_LINK "${versioned}" "${links}/${soname}" SYMBOLIC)
    endif()
  endforeach()
  set(CMAKE_LIBRARY_PATH "${CMAKE_LIBRARY_PATH};${links}" PARENT_SCOPE)
endfunction()

# find_package(Torch) and what each release needs around it; the interface target atoll_torch,
# which every target that compiles against libtorch links, carries the result.
function(atoll_find_torch)
  if(NOT TARGET protobuf::libprotobuf)
    # libtorch 2.x's Caffe2Config aliases protobuf::libprotobuf to an empty target when none is
    # known yet, which would leave atoll's protocol code unlinked.
    message(FATAL_ERROR "atoll_find_torch: find Protobuf first")
  endif()
  # libtorch's cuda.cmake ignores CMAKE_CUDA_ARCHITECTURES (it turns it OFF) and compiles for
  # TORCH_CUDA_ARCH_LIST, or for every architecture of its release when that is unset: the same
  # architectures, in its notation (90 -> 9.0).
  if(CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(archs "")
    foreach(arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
      string(REGEX REPLACE "^([0-9]+)([0-9])(-real|-virtual)?$" "\\1.\\2" arch "${arch}")
      list(APPEND archs "${arch}")
    endforeach()
    set(TORCH_CUDA_ARCH_LIST "${archs}")
  endif()
  # libtorch's config finds its own libraries (c10, torch) with find_library, whose system paths
  # come before the config's own: a PyTorch wheel's would lose to a system libtorch (Debian's 1.13
  # in /usr/lib) and the binaries would load both. The config's lib/ is searched first.
  find_file(config TorchConfig.cmake HINTS "${Torch_DIR}" PATH_SUFFIXES Torch share/cmake/Torch NO_CACHE)
  if(config)
    get_filename_component(prefix "${config}/../../../.." ABSOLUTE)
    list(PREPEND CMAKE_LIBRARY_PATH "${prefix}/lib")
  endif()
  find_package(Torch REQUIRED)
  # What find_package(Torch) set for its users, and what its CUDA part changed, for the caller.
  foreach(var Torch_VERSION TORCH_LIBRARIES TORCH_INCLUDE_DIRS TORCH_CUDA_LIBRARIES
              CMAKE_CUDA_FLAGS CMAKE_CUDA_ARCHITECTURES)
    set(${var} "${${var}}" PARENT_SCOPE)
  endforeach()

  add_library(atoll_torch INTERFACE)
  target_link_libraries(atoll_torch INTERFACE ${TORCH_LIBRARIES})
  # -pthread everywhere: gRPC targets get it, and the shared precompiled header needs the same flags.
  target_compile_options(atoll_torch INTERFACE -Wno-unused-parameter -pthread)
  # Debian 13's gRPC brings RE2's -DNOMINMAX to its users: there every torch target defines it,
  # with or without gRPC, so that the shared precompiled header's flags match theirs.
  if(Torch_VERSION VERSION_GREATER_EQUAL 2)
    target_compile_definitions(atoll_torch INTERFACE NOMINMAX)
  endif()
  # PyTorch's wheels export the parts of libstdc++ they link statically (std::filesystem among
  # them: pytorch/pytorch#133437), and a binary that loads libtorch before libstdc++ calls theirs:
  # 2.11's std::filesystem::remove_all jumps to address 0. libstdc++ goes first in every torch
  # binary's load order, so that the system's implementation serves the binary and libtorch alike.
  if(Torch_VERSION VERSION_GREATER_EQUAL 2)
    target_link_options(atoll_torch INTERFACE "LINKER:--push-state,--no-as-needed" -lstdc++
                        "LINKER:--pop-state")
  endif()
  # A PyTorch wheel carries the protobuf headers it was built with (3.13 in 2.11) among its own:
  # the system's, which atoll's generated code needs, must come first. A directory that holds only
  # a link to them goes before libtorch's.
  list(GET Protobuf_INCLUDE_DIRS 0 protobuf_include)
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    if(EXISTS "${dir}/google/protobuf" AND NOT dir STREQUAL protobuf_include)
      set(first "${CMAKE_BINARY_DIR}/protobuf-first")
      file(MAKE_DIRECTORY "${first}")
      file(CREATE_LINK "${protobuf_include}/google" "${first}/google" SYMBOLIC)
      target_include_directories(atoll_torch SYSTEM BEFORE INTERFACE "${first}")
      break()
    endif()
  endforeach()
  # CUDA 13 moved thrust, CUB and libcu++ to include/cccl; nvcc looks there, the C++ compiler
  # (c10's CUDA headers) must be told.
  if(TORCH_CUDA_LIBRARIES AND CUDAToolkit_INCLUDE_DIRS)
    foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
      if(EXISTS "${dir}/cccl")
        target_include_directories(atoll_torch SYSTEM INTERFACE "${dir}/cccl")
      endif()
    endforeach()
  endif()

  # Newer libtorch headers may refuse C++17: take the standard the torch target or its headers ask
  # for. Every atoll target then builds with it (C++17 code, C++20-clean).
  get_target_property(standard torch CXX_STANDARD)
  if(NOT standard)
    set(standard 17)
    foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
      foreach(header ATen/ATen.h c10/macros/Macros.h torch/all.h)
        if(EXISTS "${dir}/${header}")
          file(STRINGS "${dir}/${header}" cxx20 REGEX "#error.*C\\+\\+20")
          if(cxx20)
            set(standard 20)
          endif()
        endif()
      endforeach()
    endforeach()
  endif()
  if(standard GREATER CMAKE_CXX_STANDARD)
    set(CMAKE_CXX_STANDARD ${standard} PARENT_SCOPE)
  else()
    set(standard ${CMAKE_CXX_STANDARD})
  endif()
  message(STATUS "atoll: libtorch ${Torch_VERSION}, C++${standard}")
endfunction()
