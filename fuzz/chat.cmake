# Chat layer fuzzers (included by fuzz/CMakeLists.txt, which sets PEREGRINE_FUZZ_FLAGS):
#   fuzz_jinja       templates (untrusted GGUF metadata / user files) parsed and rendered by src/chat/jinja
#   fuzz_chat_parse  model output through every tool-call / reasoning parser of src/chat/parse, whole and chunked
# As for fuzz_gguf, the fuzzed sources are compiled into each fuzzer so they carry the instrumentation.
file(GLOB PEREGRINE_FUZZ_JINJA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/chat/jinja/*.cpp)
file(GLOB PEREGRINE_FUZZ_PARSE_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/chat/parse/*.cpp)

add_executable(fuzz_jinja fuzz_jinja.cpp ${PEREGRINE_FUZZ_JINJA_SOURCES} ${PROJECT_SOURCE_DIR}/src/chat/parse/chat_format.cpp)
add_executable(fuzz_chat_parse fuzz_chat_parse.cpp ${PEREGRINE_FUZZ_PARSE_SOURCES})
foreach(t fuzz_jinja fuzz_chat_parse)
  target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(${t} PRIVATE ${PEREGRINE_WARNINGS} ${PEREGRINE_FUZZ_FLAGS})
  target_link_options(${t} PRIVATE ${PEREGRINE_FUZZ_FLAGS})
  target_link_libraries(${t} PRIVATE nlohmann_json::nlohmann_json)
endforeach()
