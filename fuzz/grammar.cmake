# Structured output fuzzer (included by fuzz/CMakeLists.txt, which sets PEREGRINE_FUZZ_FLAGS):
#   fuzz_grammar  GBNF text and JSON Schemas (untrusted request fields) through the parser, the schema
#                 converter and the matcher (bytes, tokens, the mask checked against brute force)
file(GLOB PEREGRINE_FUZZ_GRAMMAR_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/grammar/*.cpp)
list(FILTER PEREGRINE_FUZZ_GRAMMAR_SOURCES EXCLUDE REGEX "vocab_tokenizer.cpp$")  # needs the tokenizer layer
add_executable(fuzz_grammar fuzz_grammar.cpp ${PEREGRINE_FUZZ_GRAMMAR_SOURCES})
target_include_directories(fuzz_grammar PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_options(fuzz_grammar PRIVATE ${PEREGRINE_WARNINGS} ${PEREGRINE_FUZZ_FLAGS})
target_link_options(fuzz_grammar PRIVATE ${PEREGRINE_FUZZ_FLAGS})
target_link_libraries(fuzz_grammar PRIVATE nlohmann_json::nlohmann_json)
