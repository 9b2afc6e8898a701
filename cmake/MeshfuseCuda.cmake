# Whether to build the CUDA backend (src/runtime/cuda), from the option MESHFUSE_CUDA:
#   AUTO (default)  build it when the CUDA toolkit (cudart), NVRTC, cuBLASLt and NCCL are all found,
#                   otherwise configure without it and say why in one STATUS line
#   ON              require it: configuring fails with what is missing
#   OFF             never build it
# Sets MESHFUSE_HAVE_CUDA (ON/OFF) and, when OFF, MESHFUSE_CUDA_ABSENT_REASON (why, for the run-time
# "built without CUDA" error). With CUDA, NCCL_INCLUDE_DIR and NCCL_LIBRARY_DIR are set too.
#
# The backend needs only headers and cudart_static at build time: NVRTC, cuBLASLt and NCCL are
# opened with dlopen on first use (src/runtime/cuda/cuda_libraries.h), but their libraries are
# looked for here as well, so that a build that has the backend can also run it on a GPU machine.

set(MESHFUSE_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO (when the CUDA toolkit, NVRTC, cuBLASLt and NCCL are found), ON (required) or OFF")
set_property(CACHE MESHFUSE_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${MESHFUSE_CUDA}" _mf_cuda_mode)
if(_mf_cuda_mode MATCHES "^(1|YES|TRUE|Y)$")
  set(_mf_cuda_mode ON)
elseif(_mf_cuda_mode MATCHES "^(0|NO|FALSE|N)$")
  set(_mf_cuda_mode OFF)
endif()
if(NOT _mf_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "MESHFUSE_CUDA is '${MESHFUSE_CUDA}'; expected AUTO, ON or OFF")
endif()

set(MESHFUSE_HAVE_CUDA OFF)
set(MESHFUSE_CUDA_ABSENT_REASON "")
if(_mf_cuda_mode STREQUAL "OFF")
  set(MESHFUSE_CUDA_ABSENT_REASON "it was configured with MESHFUSE_CUDA=OFF")
  message(STATUS "meshfuse: CUDA backend not built (MESHFUSE_CUDA=OFF)")
  return()
endif()

set(_mf_missing "")
find_package(CUDAToolkit 12.0 QUIET)
if(NOT CUDAToolkit_FOUND)
  list(APPEND _mf_missing "the CUDA toolkit >= 12.0 (cudart, nvcc: point CMake at it with -DCUDAToolkit_ROOT=DIR)")
else()
  if(NOT TARGET CUDA::cudart_static)
    list(APPEND _mf_missing "libcudart_static in ${CUDAToolkit_LIBRARY_DIR}")
  endif()
  # NVRTC and cuBLASLt: the header (compiled against) and the library (loaded at run time).
  foreach(_mf_lib nvrtc cublasLt)
    find_path(MESHFUSE_${_mf_lib}_INCLUDE_DIR ${_mf_lib}.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    if(NOT TARGET CUDA::${_mf_lib} OR NOT MESHFUSE_${_mf_lib}_INCLUDE_DIR)
      list(APPEND _mf_missing "${_mf_lib} (${_mf_lib}.h and lib${_mf_lib}.so of the CUDA toolkit)")
    endif()
  endforeach()
endif()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  list(APPEND _mf_missing "NCCL (nccl.h and libnccl.so: point CMake at them with -DNCCL_INCLUDE_DIR=DIR -DNCCL_LIBRARY=FILE)")
endif()

if(_mf_missing)
  list(JOIN _mf_missing ", " _mf_missing_text)
  if(_mf_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "MESHFUSE_CUDA=ON but the CUDA backend cannot be built: not found: ${_mf_missing_text}. "
                        "Install them (a CUDA toolkit >= 12 with NCCL, e.g. in /usr/local/cuda) or configure with "
                        "-DMESHFUSE_CUDA=AUTO or OFF to build without it.")
  endif()
  set(MESHFUSE_CUDA_ABSENT_REASON "CUDA was not found when it was configured (not found: ${_mf_missing_text})")
  message(STATUS "meshfuse: building WITHOUT the CUDA backend: not found: ${_mf_missing_text} "
                 "(-DMESHFUSE_CUDA=ON makes this an error)")
  return()
endif()

set(MESHFUSE_HAVE_CUDA ON)
get_filename_component(NCCL_LIBRARY_DIR ${NCCL_LIBRARY} DIRECTORY)
message(STATUS "meshfuse: CUDA backend: CUDA ${CUDAToolkit_VERSION} (${CUDAToolkit_LIBRARY_DIR}), NCCL ${NCCL_LIBRARY}")
