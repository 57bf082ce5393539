# fuzz_server_request: the HTTP server's request bodies through the handlers' own parsing, rendering
# and validation code (see fuzz_server_request.cpp). The server's request code and the chat template
# engine / output parser it drives are compiled into the fuzzer (instrumented); the tokenizer and
# GGUF reader come from their libraries. Seeds and dictionary: fuzz/seeds_server/.
file(GLOB_RECURSE PEREGRINE_FUZZ_CHAT_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/chat/*.cpp)
file(GLOB PEREGRINE_FUZZ_SERVER_GRAMMAR_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/grammar/*.cpp)
add_executable(fuzz_server_request
  fuzz_server_request.cpp
  ${PROJECT_SOURCE_DIR}/src/server/json_util.cpp
  ${PROJECT_SOURCE_DIR}/src/server/chat_request.cpp
  ${PROJECT_SOURCE_DIR}/src/server/chat_prompt.cpp
  ${PROJECT_SOURCE_DIR}/src/server/prepare.cpp
  ${PROJECT_SOURCE_DIR}/src/engine/sampler.cpp
  # Structured output: schema / grammar fields are converted and parsed while the request is parsed.
  ${PROJECT_SOURCE_DIR}/src/server/structured.cpp
  ${PROJECT_SOURCE_DIR}/src/engine/constraint.cpp
  ${PROJECT_SOURCE_DIR}/src/spec/tree.cpp
  ${PEREGRINE_FUZZ_SERVER_GRAMMAR_SOURCES}
  ${PEREGRINE_FUZZ_CHAT_SOURCES})
target_include_directories(fuzz_server_request PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(fuzz_server_request PRIVATE PG_FUZZ_CHATML="${PROJECT_SOURCE_DIR}/tests/server/chatml.jinja"
  PG_FUZZ_CHATML_THINK_TOOLS="${CMAKE_CURRENT_SOURCE_DIR}/seeds_server/chatml_think_tools.jinja")
target_compile_options(fuzz_server_request PRIVATE ${PEREGRINE_WARNINGS} ${PEREGRINE_FUZZ_FLAGS})
target_link_options(fuzz_server_request PRIVATE ${PEREGRINE_FUZZ_FLAGS})
target_link_libraries(fuzz_server_request PRIVATE pg_tokenizer pg_gguf pg_core nlohmann_json::nlohmann_json Threads::Threads)
