#!/usr/bin/env bash
# Coverage-guided fuzzing (clang, libFuzzer + ASan + UBSan) of the parsers of untrusted bytes:
#
#   gguf            model files (src/gguf): the hostile corpus, the valid corpus base and small valid
#                   copies of every golden model (fuzz/make_seeds.py) as seeds
#   server_request  HTTP request bodies of every route, up to the engine's admission checks (src/server)
#   jinja           chat templates, parsed and rendered under the sandbox limits (src/chat/jinja)
#   chat_parse      model output through every tool-call/reasoning parser family, whole and in chunks,
#                   which must parse identically (src/chat/parse)
#   grammar         GBNF text and JSON Schemas through the parser, converter and matcher, the token
#                   mask checked against brute force (src/grammar)
#   block_file      prefix-cache block file headers, as found in --kv-cache-dir (src/kv/disk_cache)
#
#   scripts/fuzz.sh gguf                      # one target, its default number of executions
#   RUNS=10000000 JOBS=2 scripts/fuzz.sh all  # every target in turn
#
# Environment: BUILD (default build-fuzz), RUNS (executions per target; default per target below), JOBS
# (parallel fuzzing processes, default 1), SHARED (default ../shared beside the checkout). A finding
# leaves crash-*/timeout-*/oom-* in $BUILD and makes this script fail; new interesting inputs are kept in
# $BUILD/fuzz-<target>-corpus between runs.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build-fuzz}
JOBS=${JOBS:-1}
SHARED=${SHARED:-${PEREGRINE_SHARED:-$ROOT/../shared}}
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && { sed -n '2,20p' "$0"; exit 2; }
[ "${TARGETS[0]}" = all ] && TARGETS=(gguf server_request jinja chat_parse grammar block_file)

command -v clang++ >/dev/null || { echo "fuzz: clang++ is required (apt-get install clang)" >&2; exit 1; }
if [ ! -f "$BUILD/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -G Ninja -DPEREGRINE_FUZZ=ON -DPEREGRINE_TESTS=OFF \
    -DPEREGRINE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi

for target in "${TARGETS[@]}"; do
  SEEDS="$BUILD/fuzz-$target-seeds"
  WORK="$BUILD/fuzz-$target-corpus"
  mkdir -p "$SEEDS" "$WORK"
  ARGS=(-print_final_stats=1 -rss_limit_mb=2048)
  case "$target" in
    gguf)
      runs=1000000
      ARGS+=(-max_len=65536 -timeout=10)
      /usr/bin/python3 "$ROOT/fuzz/make_seeds.py" "$SEEDS" "$SHARED"/golden/models/*.gguf "$SHARED"/testdata/models/stories260K.gguf
      cp "$ROOT"/tests/gguf/corpus/*.gguf "$ROOT/tests/gguf/valid_base.gguf" "$SEEDS/"
      ;;
    server_request)
      runs=3000000
      ARGS+=(-max_len=16384 -timeout=5 -dict="$ROOT/fuzz/seeds_server/server.dict")
      cp "$ROOT"/fuzz/seeds_server/corpus/* "$SEEDS/"
      ;;
    jinja)
      # One legitimate operation on a string near the 64 MB cap takes seconds under the sanitizers.
      runs=2000000
      ARGS+=(-max_len=16384 -timeout=25 -dict="$ROOT/fuzz/chat_jinja.dict")
      /usr/bin/python3 "$ROOT/fuzz/seeds_chat/make_seeds.py" "$BUILD/fuzz-chat-seeds" "$SHARED"
      cp "$BUILD"/fuzz-chat-seeds/jinja/* "$SEEDS/"
      ;;
    chat_parse)
      # -len_control=0: without it libFuzzer keeps inputs under a few hundred bytes.
      runs=400000
      ARGS+=(-max_len=8192 -timeout=30 -len_control=0 -dict="$ROOT/fuzz/chat_parse.dict")
      /usr/bin/python3 "$ROOT/fuzz/seeds_chat/make_seeds.py" "$BUILD/fuzz-chat-seeds" "$SHARED"
      cp "$BUILD"/fuzz-chat-seeds/parse/* "$SEEDS/"
      ;;
    grammar)
      runs=1000000
      ARGS+=(-max_len=4096 -timeout=10 -len_control=0)
      /usr/bin/python3 "$ROOT/fuzz/seeds_grammar/make_seeds.py" "$SEEDS" "$SHARED"
      ;;
    block_file)
      runs=2000000
      ARGS+=(-max_len=4096 -timeout=5)
      cp "$ROOT"/fuzz/seeds_kv/*.bin "$SEEDS/"
      ;;
    *)
      echo "fuzz: unknown target '$target' (gguf, server_request, jinja, chat_parse, grammar, block_file, all)" >&2
      exit 2
      ;;
  esac
  ninja -C "$BUILD" "fuzz_$target"
  ARGS+=(-runs="${RUNS:-$runs}")
  [ "$JOBS" -gt 1 ] && ARGS+=(-jobs="$JOBS" -workers="$JOBS")
  echo "=== fuzz_$target: ${RUNS:-$runs} executions"
  (cd "$BUILD" && "$BUILD/fuzz/fuzz_$target" "${ARGS[@]}" "$WORK" "$SEEDS")
done
