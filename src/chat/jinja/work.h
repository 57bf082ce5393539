// Work and memory metering for operations whose cost grows with their operands.
//
// The interpreter charges one step per statement, loop iteration, call and filter, which bounds a render only if each
// of those does a bounded amount of work. Comparing, searching, decoding or looking up in a large value does not: one
// `big == other` on two 60 MB strings, or one key lookup in a 100k-item dict (linear), is a single step that does
// millions of operations, and a loop of such steps ran for minutes within the default cap. The primitives that do such
// work report it here, in "work bytes", and the render running on this thread turns every kWorkBytesPerStep of it
// into one step, so Limits::max_steps bounds it too (and stops it part way when it runs out).
#pragma once
#include <cstdint>

namespace pg::jinja {

// About the cost of one interpreter step: memchr/memcmp-like scans are charged a byte per byte, code point loops and
// container walks a few bytes per element.
inline constexpr uint64_t kWorkBytesPerStep = 64;
// Work bytes charged per container element visited (a refcount copy or a comparison of two values).
inline constexpr uint64_t kWorkPerItem = 8;

// Charges `bytes` of work to the render running on this thread; a no-op outside a render (parsing, tests).
// Throws the kLimit Error when the render's step budget runs out.
void charge_work(uint64_t bytes);

// Charges `bytes` of memory to the render running on this thread (Limits::max_alloc_bytes), for string helpers that
// build many objects before the interpreter sees them (str.split into a million parts); a no-op outside a render.
void charge_alloc(uint64_t bytes);

}  // namespace pg::jinja
