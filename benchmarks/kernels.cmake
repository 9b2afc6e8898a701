# Generated-kernel benchmarks (CPU backend): each prints ratios against baselines measured in the
# same run (memcpy, direct cblas_sgemm, PyTorch CPU eager through benchmarks/kernels_torch.py).
# Results: benchmarks/results/cpu-kernels.md.
set(MESHFUSE_BENCH_VENV_PYTHON "${MESHFUSE_VENV}/bin/python")
if(NOT MESHFUSE_VENV)
  set(MESHFUSE_BENCH_VENV_PYTHON "$ENV{HOME}/.cache/meshfuse/venv/bin/python")
endif()
foreach(name pointwise gemm mlp decoder)
  add_executable(kernels_${name} ${CMAKE_CURRENT_LIST_DIR}/kernels_${name}.cpp)
  target_include_directories(kernels_${name} PRIVATE ${CBLAS_INCLUDE_DIR})
  target_link_libraries(kernels_${name} PRIVATE meshfuse_internal meshfuse_models ${BLAS_LIBRARIES})
  target_compile_definitions(kernels_${name} PRIVATE MESHFUSE_VENV_PYTHON="${MESHFUSE_BENCH_VENV_PYTHON}"
                             MESHFUSE_BENCH_DIR="${CMAKE_CURRENT_LIST_DIR}")
endforeach()
