# fuzz_block_file: the prefix cache's disk-tier block-file header parser (src/kv/disk_cache.cpp), the
# code that reads files another process (or a crash, or a bad disk) may have left in --kv-cache-dir.
add_executable(fuzz_block_file
  fuzz_block_file.cpp
  ${PROJECT_SOURCE_DIR}/src/kv/disk_cache.cpp)
target_include_directories(fuzz_block_file PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_options(fuzz_block_file PRIVATE ${PEREGRINE_WARNINGS} ${PEREGRINE_FUZZ_FLAGS})
target_link_options(fuzz_block_file PRIVATE ${PEREGRINE_FUZZ_FLAGS})
target_link_libraries(fuzz_block_file PRIVATE pg_core Threads::Threads)
