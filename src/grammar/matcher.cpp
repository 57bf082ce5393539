// Byte-level pushdown recogniser, vocabulary trie and the allowed-token mask.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "grammar/grammar.h"

namespace pg::grammar {

// ---- Vocabulary trie ------------------------------------------------------------------------------
std::shared_ptr<const Vocab> Vocab::build(std::vector<std::string> pieces, std::vector<bool> eog) {
  PG_CHECK(eog.size() == pieces.size(), "grammar: vocab pieces and eog flags differ in size");
  // The mask walk recurses once per byte of a piece: bound it (real vocabularies stay under ~256).
  for (size_t i = 0; i < pieces.size(); ++i) {
    PG_CHECK(pieces[i].size() <= 4096, "grammar: token " + std::to_string(i) + " has a piece over 4096 bytes");
  }
  auto v = std::make_shared<Vocab>();
  // Sort token ids by piece, then lay the trie out in depth-first order (the order the mask walk
  // visits it, so the walk streams through nodes and edges); the children of a node are one
  // contiguous, byte-sorted run of edges.
  std::vector<int32_t> order;
  for (int32_t i = 0; i < static_cast<int32_t>(pieces.size()); ++i) {
    if (!pieces[i].empty()) order.push_back(i);
    if (eog[i]) v->eog_ids_.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return pieces[a] < pieces[b]; });
  struct Work {
    uint32_t node;
    size_t lo, hi, depth;  // tokens order[lo, hi) share a prefix of length depth
  };
  v->nodes_.push_back({0, 0, 0, 0});
  std::vector<Work> stack{{0, 0, order.size(), 0}};
  std::vector<Work> kids;
  while (!stack.empty()) {
    Work w = stack.back();
    stack.pop_back();
    size_t i = w.lo;
    v->nodes_[w.node].first_token = static_cast<uint32_t>(v->token_at_.size());
    while (i < w.hi && pieces[order[i]].size() == w.depth) v->token_at_.push_back(order[i++]);
    v->nodes_[w.node].n_tokens = static_cast<uint32_t>(v->token_at_.size()) - v->nodes_[w.node].first_token;
    v->nodes_[w.node].first_edge = static_cast<uint32_t>(v->edges_.size());
    kids.clear();
    while (i < w.hi) {
      uint8_t b = static_cast<uint8_t>(pieces[order[i]][w.depth]);
      size_t j = i;
      while (j < w.hi && static_cast<uint8_t>(pieces[order[j]][w.depth]) == b) ++j;
      uint32_t child = static_cast<uint32_t>(v->nodes_.size());
      v->nodes_.push_back({0, 0, 0, 0});
      v->edges_.push_back({b, child});
      kids.push_back({child, i, j, w.depth + 1});
      i = j;
    }
    v->nodes_[w.node].n_edges = static_cast<uint32_t>(kids.size());
    stack.insert(stack.end(), kids.rbegin(), kids.rend());  // first child processed next
  }
  // Children have larger ids than their parent, so one pass from the last node up folds subtrees.
  const size_t nn = v->nodes_.size();
  v->sub_bytes_.assign(nn, {0, 0, 0, 0});
  v->sub_end_.assign(nn, 0);
  for (size_t n = nn; n-- > 0;) {
    const Node& nd = v->nodes_[n];
    uint32_t end = nd.first_token + nd.n_tokens;
    auto& bytes = v->sub_bytes_[n];
    for (uint32_t e = 0; e < nd.n_edges; ++e) {
      const Edge& ed = v->edges_[nd.first_edge + e];
      bytes[ed.byte >> 6] |= 1ull << (ed.byte & 63);
      for (int k = 0; k < 4; ++k) bytes[k] |= v->sub_bytes_[ed.child][k];
      end = std::max(end, v->sub_end_[ed.child]);
    }
    v->sub_end_[n] = end;
  }
  v->pieces_ = std::move(pieces);
  v->eog_ = std::move(eog);
  return v;
}

// ---- Stack arena ----------------------------------------------------------------------------------
// Stacks during one operation are hash-consed linked frames: (pos, parent) -> id, so identical stacks
// have identical ids (dedup is an integer compare) and advancing never copies a stack.
// Parent -1 = the real bottom; parent <= -2 = the bottom of a window (see allowed_tokens), window j
// = -2 - j. The same negative values as results mean "this stack emptied": -1 the grammar may end,
// -2 - j popped out of window j.
namespace {

constexpr int32_t kBottom = -1;

struct FlatMap {  // uint64 -> int32, open addressing, cleared by generation
  std::vector<uint64_t> keys;
  std::vector<int32_t> vals;
  std::vector<uint32_t> gen;
  uint32_t cur = 1;
  size_t used = 0;
  void reset() {
    if (keys.empty()) resize(1 << 12);
    ++cur;
    used = 0;
  }
  void resize(size_t n) {
    keys.assign(n, 0);
    vals.assign(n, 0);
    gen.assign(n, 0);
    cur = 1;
    used = 0;
  }
  static uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }
  // Returns a pointer to the value slot; *inserted tells whether it is new.
  int32_t* find_or_insert(uint64_t k, bool* inserted) {
    if ((used + 1) * 2 > keys.size()) grow();
    size_t m = keys.size() - 1, i = mix(k) & m;
    while (gen[i] == cur) {
      if (keys[i] == k) {
        *inserted = false;
        return &vals[i];
      }
      i = (i + 1) & m;
    }
    gen[i] = cur;
    keys[i] = k;
    ++used;
    *inserted = true;
    return &vals[i];
  }
  void grow() {
    std::vector<uint64_t> ok = std::move(keys);
    std::vector<int32_t> ov = std::move(vals);
    std::vector<uint32_t> og = std::move(gen);
    uint32_t oc = cur;
    resize(ok.size() * 2);
    for (size_t i = 0; i < ok.size(); ++i) {
      if (og[i] == oc) {
        bool ins;
        *find_or_insert(ok[i], &ins) = ov[i];
      }
    }
  }
};

struct Arena {
  const Grammar* g = nullptr;
  size_t max_stacks = 4096;
  std::vector<uint32_t> pos;
  std::vector<int32_t> parent;
  FlatMap intern_map, visit, memo;
  std::vector<int32_t> memo_pool;  // advance results: memo value = offset, then [n, ids...]

  void reset(const Grammar* gr) {
    g = gr;
    max_stacks = gr->limits().max_stacks;
    pos.clear();
    parent.clear();
    intern_map.reset();
    memo.reset();
    memo_pool.clear();
  }
  int32_t intern(uint32_t p, int32_t par) {
    bool ins;
    uint64_t k = (static_cast<uint64_t>(p) << 32) | static_cast<uint32_t>(par);
    int32_t* v = intern_map.find_or_insert(k, &ins);
    if (ins) {
      *v = static_cast<int32_t>(pos.size());
      pos.push_back(p);
      parent.push_back(par);
    }
    return *v;
  }

  // All stacks reachable from frame (p over parent) without consuming a byte: terminal-topped ids or
  // negative "emptied" markers, appended to out (deduplicated). Iterative (an explicit work list):
  // a long run of nullable references must not recurse once per reference.
  std::vector<std::pair<uint32_t, int32_t>> work;
  void expand(uint32_t p0, int32_t par0, std::vector<int32_t>& out) {
    visit.reset();
    const size_t start = out.size();
    const auto& els = g->elements();
    work.clear();
    work.push_back({p0, par0});
    while (!work.empty()) {
      auto [p, par] = work.back();
      work.pop_back();
      for (;;) {
        const auto& e = els[p];
        if (e.kind == Grammar::Kind::Bytes) {
          push_unique(intern(p, par), out, start);
          break;
        }
        bool ins;
        visit.find_or_insert((static_cast<uint64_t>(p) << 32) | static_cast<uint32_t>(par), &ins);
        if (!ins) break;  // already expanded this frame in this expansion
        if (e.kind == Grammar::Kind::End) {
          if (par < 0) {
            push_unique(par, out, start);
            break;
          }
          p = pos[par];
          par = parent[par];
          continue;
        }
        // Ref: the return position is pushed unless it ends its alternative (a tail call).
        uint32_t ret = p + 1;
        int32_t np = els[ret].kind == Grammar::Kind::End ? par : intern(ret, par);
        const auto& alts = g->alternatives(e.arg);
        for (size_t k = alts.size(); k-- > 0;) work.push_back({alts[k], np});
        break;
      }
    }
  }
  void push_unique(int32_t id, std::vector<int32_t>& out, size_t start) {
    for (size_t k = start; k < out.size(); ++k) {
      if (out[k] == id) return;
    }
    out.push_back(id);
    if (out.size() - start > max_stacks) throw Error("grammar: too many parallel parses (over " + std::to_string(max_stacks) + "); the grammar is too ambiguous");
  }

  // Stacks after consuming byte b on stack id (a terminal-topped stack); memoised per (id, b).
  // Returns [begin, end) into memo_pool.
  std::pair<const int32_t*, const int32_t*> advance(int32_t id, uint8_t b, std::vector<int32_t>& tmp) {
    const auto& set = g->byte_sets()[g->elements()[pos[id]].arg];
    if (!set.test(b)) return {nullptr, nullptr};
    bool ins;
    int32_t* slot = memo.find_or_insert((static_cast<uint64_t>(id) << 8) | b, &ins);
    if (ins) {
      tmp.clear();
      // pos/parent may grow during expand: copy first.
      uint32_t p = pos[id] + 1;
      int32_t par = parent[id];
      expand(p, par, tmp);
      int32_t off = static_cast<int32_t>(memo_pool.size());
      memo_pool.push_back(static_cast<int32_t>(tmp.size()));
      memo_pool.insert(memo_pool.end(), tmp.begin(), tmp.end());
      slot = memo.find_or_insert((static_cast<uint64_t>(id) << 8) | b, &ins);  // the table may have grown
      *slot = off;
    }
    const int32_t* base = memo_pool.data() + *slot;
    return {base + 1, base + 1 + *base};
  }

  // Interns a real stack (bottom first), the top frames only when window > 0 and the stack is deeper
  // (its bottom then becomes the window marker wid).
  int32_t intern_stack(const std::vector<uint32_t>& st, size_t window, int32_t wid) {
    size_t from = (window > 0 && st.size() > window) ? st.size() - window : 0;
    int32_t par = from > 0 ? -2 - wid : kBottom;
    for (size_t k = from; k < st.size(); ++k) par = intern(st[k], par);
    return par;
  }
  void to_stack(int32_t id, std::vector<uint32_t>& st) const {
    st.clear();
    for (int32_t x = id; x >= 0; x = parent[x]) st.push_back(pos[x]);
    std::reverse(st.begin(), st.end());
  }
};

thread_local Arena t_arena;
bool g_subtree_skip = true;

// Depth-first trie walk over a lazily built subset automaton: the sets of stacks met during the walk
// are interned (set ids), and each (set, byte) transition is computed once into a dense 256-wide
// table, so a trie edge costs one table load however many stacks the set holds (a JSON string state
// holds ~10: one per UTF-8 lead-byte class). Tokens ending at a child that some stack survives are set
// in mask; a stack that pops out of a window is reported through exits.
struct Walker {
  Arena& A;
  const Vocab& V;
  uint32_t* mask;
  std::vector<std::pair<uint32_t, uint32_t>>* exits = nullptr;  // (trie node, window j)

  static constexpr int32_t kUnknown = -2, kEmpty = -1;
  static constexpr size_t kMaxDense = 16384;
  struct SetInfo {
    uint32_t off, len;              // live stack ids in pool
    uint32_t exit_off, exit_len;    // window markers j in pool
    bool live;                      // has stacks that can take more bytes
    uint64_t loop[4] = {0, 0, 0, 0};     // bytes b known to step this set to itself
    uint64_t loop_no[4] = {0, 0, 0, 0};  // bytes known not to
  };
  std::vector<int32_t> pool;
  std::vector<SetInfo> sets;
  std::vector<int32_t> trans;  // set * 256 + byte -> set id, kEmpty or kUnknown
  std::unordered_map<std::string, int32_t> set_index;
  std::vector<int32_t> tmp, acc;

  // Interns a sorted, unique list of result ids (stack ids >= 0, markers < 0). Returns kEmpty for none.
  int32_t intern_set(std::vector<int32_t>& ids) {
    if (ids.empty()) return kEmpty;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    if (ids.size() > 16 * A.max_stacks)  // as in accept_bytes: a state whose parses double with every byte
      throw Error("grammar: too many parallel parses (over " + std::to_string(16 * A.max_stacks) + "); the grammar is too ambiguous");
    std::string key(reinterpret_cast<const char*>(ids.data()), ids.size() * 4);
    auto it = set_index.find(key);
    if (it != set_index.end()) return it->second;
    SetInfo si{};
    si.off = static_cast<uint32_t>(pool.size());
    for (int32_t x : ids) {
      if (x >= 0) pool.push_back(x);
    }
    si.len = static_cast<uint32_t>(pool.size()) - si.off;
    si.exit_off = static_cast<uint32_t>(pool.size());
    for (int32_t x : ids) {
      if (x <= -2) pool.push_back(-2 - x);
    }
    si.exit_len = static_cast<uint32_t>(pool.size()) - si.exit_off;
    si.live = si.len > 0;
    int32_t id = static_cast<int32_t>(sets.size());
    sets.push_back(si);
    // Dense transitions for the first kMaxDense sets (1 KB each); later sets (only an adversarial
    // grammar gets there: JSON schemas need tens) are stepped without memoisation.
    if (sets.size() <= kMaxDense) trans.resize(trans.size() + 256, kUnknown);
    set_index.emplace(std::move(key), id);
    return id;
  }
  int32_t step(int32_t set, uint8_t b) {
    const size_t slot = static_cast<size_t>(set) * 256 + b;
    if (slot < trans.size() && trans[slot] != kUnknown) return trans[slot];
    acc.clear();
    const SetInfo si = sets[set];
    for (uint32_t k = 0; k < si.len; ++k) {
      auto [q, e] = A.advance(pool[si.off + k], b, tmp);
      acc.insert(acc.end(), q, e);
    }
    int32_t r = intern_set(acc);
    if (slot < trans.size()) trans[slot] = r;
    return r;
  }
  void set_tokens(uint32_t node) {
    const auto& nd = V.nodes_[node];
    for (uint32_t k = 0; k < nd.n_tokens; ++k) {
      int32_t t = V.token_at_[nd.first_token + k];
      mask[t >> 5] |= 1u << (t & 31);
    }
  }
  // Whether this set steps back to itself on every byte of sb (4 x 64 bits). Per set, bytes are
  // classified lazily (yes / no), only the bytes met in subtrees, stopping at the first "no".
  bool loops_on(int32_t set, const std::array<uint64_t, 4>& sb) {
    for (int k = 0; k < 4; ++k) {
      if (sb[k] & sets[set].loop_no[k]) return false;
      uint64_t unknown = sb[k] & ~(sets[set].loop[k] | sets[set].loop_no[k]);
      while (unknown) {
        const int bit = __builtin_ctzll(unknown);
        unknown &= unknown - 1;
        const bool yes = step(set, static_cast<uint8_t>(k * 64 + bit)) == set;
        SetInfo& si = sets[set];  // step() may have grown sets
        (yes ? si.loop : si.loop_no)[k] |= 1ull << bit;
        if (!yes) return false;
      }
    }
    return true;
  }
  void walk(uint32_t node, int32_t set) {
    const auto& nd = V.nodes_[node];
    for (uint32_t e = 0; e < nd.n_edges; ++e) {
      const auto& edge = V.edges_[nd.first_edge + e];
      int32_t t = step(set, edge.byte);
      if (t < 0) continue;
      // The state loops on every byte below the child (a JSON string's interior and plain text
      // tokens): all of the child's subtree is accepted, its tokens are one contiguous run.
      if (g_subtree_skip && sets[t].exit_len == 0 && V.nodes_[edge.child].n_edges > 0) {
        {
          if (loops_on(t, V.sub_bytes_[edge.child])) {
            for (uint32_t k = V.nodes_[edge.child].first_token; k < V.sub_end_[edge.child]; ++k) {
              const int32_t tok = V.token_at_[k];
              mask[tok >> 5] |= 1u << (tok & 31);
            }
            continue;
          }
        }
      }
      set_tokens(edge.child);
      const SetInfo& si = sets[t];
      if (exits) {
        for (uint32_t k = 0; k < si.exit_len; ++k) exits->push_back({edge.child, static_cast<uint32_t>(pool[si.exit_off + k])});
      }
      if (si.live && V.nodes_[edge.child].n_edges > 0) walk(edge.child, t);
    }
  }
  // Walks the subtree of node from the given stack ids (live ones only are used).
  void walk_from(uint32_t node, std::vector<int32_t> ids) {
    ids.erase(std::remove_if(ids.begin(), ids.end(), [](int32_t x) { return x < 0; }), ids.end());
    int32_t s = intern_set(ids);
    if (s >= 0) walk(node, s);
  }
};

}  // namespace

// Window masks, keyed by the top frames of every stack of a state.
struct MaskCache {
  struct Entry {
    TokenMask mask;
    std::vector<std::pair<uint32_t, uint32_t>> exits;
  };
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<const Entry>> map;
  uint64_t hits = 0, misses = 0;
  static constexpr size_t kMaxEntries = 512;  // 512 x 19 KB masks for a 151 936-token vocabulary
};

static constexpr size_t kWindow = 3;

Matcher::Matcher(std::shared_ptr<const Grammar> g, std::shared_ptr<const Vocab> v)
    : g_(std::move(g)), v_(std::move(v)), cache_(std::make_shared<MaskCache>()) {
  PG_CHECK(g_ && v_, "grammar: matcher needs a grammar and a vocabulary");
  Arena& A = t_arena;
  A.reset(g_.get());
  std::vector<int32_t> ids;
  for (uint32_t a : g_->alternatives(g_->root())) {
    std::vector<int32_t> part;
    A.expand(a, kBottom, part);
    for (int32_t x : part) {
      if (std::find(ids.begin(), ids.end(), x) == ids.end()) ids.push_back(x);
    }
  }
  for (int32_t id : ids) {
    Stack s;
    if (id >= 0) A.to_stack(id, s);
    stacks_.push_back(std::move(s));
  }
  std::sort(stacks_.begin(), stacks_.end());
  stacks_.erase(std::unique(stacks_.begin(), stacks_.end()), stacks_.end());
}

bool Matcher::can_end() const { return !stacks_.empty() && stacks_.front().empty(); }

bool Matcher::accept_bytes(std::string_view bytes) {
  Arena& A = t_arena;
  A.reset(g_.get());
  std::vector<int32_t> cur, next, tmp;
  for (const auto& s : stacks_) {
    if (!s.empty()) cur.push_back(A.intern_stack(s, 0, 0));
  }
  bool end = false;
  for (size_t i = 0; i < bytes.size(); ++i) {
    next.clear();
    for (int32_t id : cur) {
      auto [b, e] = A.advance(id, static_cast<uint8_t>(bytes[i]), tmp);
      for (const int32_t* q = b; q != e; ++q) {
        if (std::find(next.begin(), next.end(), *q) == next.end()) next.push_back(*q);
      }
    }
    // Each expansion is bounded, but their union could still double with every byte (x ::= "a" x "b" |
    // "a" x "c" | ""): bound the state as a whole, or a 40-byte answer takes 2^40 stacks.
    // (16x one expansion's bound: a schema with 2 000 optional properties has a few thousand stacks
    // after `{"p` and is legitimate.)
    if (next.size() > 16 * A.max_stacks)
      throw Error("grammar: too many parallel parses (over " + std::to_string(16 * A.max_stacks) + "); the grammar is too ambiguous");
    // An emptied stack (-1) takes no further byte: it only records "may end here".
    cur.clear();
    end = false;
    for (int32_t x : next) {
      if (x >= 0) {
        cur.push_back(x);
      } else {
        end = true;
      }
    }
    if (cur.empty() && !(end && i + 1 == bytes.size())) return false;
  }
  if (bytes.empty()) return true;
  std::vector<Stack> ns;
  if (end) ns.emplace_back();
  for (int32_t id : cur) {
    Stack s;
    A.to_stack(id, s);
    ns.push_back(std::move(s));
  }
  std::sort(ns.begin(), ns.end());
  ns.erase(std::unique(ns.begin(), ns.end()), ns.end());
  stacks_ = std::move(ns);
  return true;
}

bool Matcher::accept_token(int32_t id) {
  PG_CHECK(id >= 0 && id < v_->n_vocab(), "grammar: token id out of range");
  if (v_->is_eog(id)) {
    if (!can_end()) return false;
    stacks_ = {Stack{}};  // finished: nothing but the end
    return true;
  }
  const std::string& p = v_->piece(id);
  if (p.empty()) return false;
  return accept_bytes(p);
}

void Matcher::allowed_tokens(TokenMask& mask) const {
  const size_t words = (static_cast<size_t>(v_->n_vocab()) + 31) / 32;
  mask.assign(words, 0);
  if (can_end()) {
    for (int32_t t : v_->eog_ids_) mask[t >> 5] |= 1u << (t & 31);
  }
  // Cache key: every stack's window (its top kWindow frames) and whether it is deeper than that.
  std::string key;
  std::vector<size_t> truncated;  // per stack index in the key (live stacks only): is it deeper
  std::vector<const Stack*> live;
  for (const auto& s : stacks_) {
    if (s.empty()) continue;
    live.push_back(&s);
    size_t from = s.size() > kWindow ? s.size() - kWindow : 0;
    uint32_t hdr = static_cast<uint32_t>((s.size() - from) | (from > 0 ? 0x80000000u : 0));
    key.append(reinterpret_cast<const char*>(&hdr), 4);
    key.append(reinterpret_cast<const char*>(s.data() + from), 4 * (s.size() - from));
  }
  if (live.empty()) return;

  std::shared_ptr<const MaskCache::Entry> entry;
  {
    std::lock_guard<std::mutex> lk(cache_->mu);
    auto it = cache_->map.find(key);
    if (it != cache_->map.end()) {
      entry = it->second;
      ++cache_->hits;
    }
  }
  Arena& A = t_arena;
  if (!entry) {
    A.reset(g_.get());
    auto e = std::make_shared<MaskCache::Entry>();
    e->mask.assign(words, 0);
    std::vector<int32_t> ids;
    for (size_t j = 0; j < live.size(); ++j) {
      int32_t id = A.intern_stack(*live[j], kWindow, static_cast<int32_t>(j));
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
    Walker w{A, *v_, e->mask.data(), &e->exits, {}, {}, {}, {}, {}, {}};
    w.walk_from(0, ids);

    entry = e;
    std::lock_guard<std::mutex> lk(cache_->mu);
    ++cache_->misses;
    if (cache_->map.size() >= MaskCache::kMaxEntries) cache_->map.clear();
    cache_->map.emplace(key, entry);
  }
  for (size_t k = 0; k < words; ++k) mask[k] |= entry->mask[k];
  if (entry->exits.empty()) return;

  // Tokens that popped out of a window: continue them with the real frames below it.
  A.reset(g_.get());
  std::vector<std::vector<int32_t>> below(live.size());
  std::vector<char> have(live.size(), 0);
  Walker w{A, *v_, mask.data(), nullptr, {}, {}, {}, {}, {}, {}};
  for (auto [node, j] : entry->exits) {
    if (!have[j]) {
      have[j] = 1;
      const Stack& s = *live[j];
      Stack rest(s.begin(), s.end() - static_cast<long>(kWindow));
      int32_t top = A.intern_stack(rest, 0, 0);
      A.expand(A.pos[top], A.parent[top], below[j]);
    }
    w.set_tokens(node);
    if (v_->nodes_[node].n_edges > 0) w.walk_from(node, below[j]);
  }
}

void Matcher::allowed_tokens_brute(TokenMask& mask) const {
  mask.assign((static_cast<size_t>(v_->n_vocab()) + 31) / 32, 0);
  for (int32_t t = 0; t < v_->n_vocab(); ++t) {
    Matcher m = clone();
    if (m.accept_token(t)) mask[t >> 5] |= 1u << (t & 31);
  }
}

void set_subtree_skip(bool on) { g_subtree_skip = on; }

Matcher::CacheStats Matcher::cache_stats() const {
  std::lock_guard<std::mutex> lk(cache_->mu);
  return {cache_->hits, cache_->misses};
}

}  // namespace pg::grammar
