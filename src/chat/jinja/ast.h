// Syntax tree of a parsed template. Nodes are immutable after parsing, so one parsed Template can
// be rendered from several threads at once.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja/value.h"

namespace pg::jinja {

struct Expr;
struct Stmt;
using ExprP = std::unique_ptr<Expr>;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

enum class ExprKind : uint8_t {
  kConst,
  kName,
  kGetattr,
  kGetitem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kNeg,
  kPos,
  kNot,
  kBinary,
  kAnd,
  kOr,
  kConcat,
  kCompare,
  kCondExpr,
  kList,
  kTuple,
  kDict,
};

enum class BinOp : uint8_t { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CmpOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct CallArgs {
  std::vector<ExprP> args;
  std::vector<std::pair<std::string, ExprP>> kwargs;
  ExprP dyn_args, dyn_kwargs;
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;                 // kConst
  std::string name;            // kName, kGetattr attribute, kFilter/kTest name
  ExprP a, b, c, d;            // operands: node/left/right, slice start/stop/step, condexpr test/then/else
  BinOp op = BinOp::kAdd;      // kBinary
  std::vector<ExprP> items;    // kList, kTuple, kConcat, kDict keys (even) / values (odd), kCompare operands
  std::vector<CmpOp> cmp_ops;  // kCompare
  CallArgs call;               // kCall, kFilter, kTest
  bool soft = false;           // kFilter/kTest: unknown name is a runtime error (inside if / condexpr)
  // Contains a slice: jinja2's compile-time evaluation may fold it, where a failing slice gives
  // Undefined instead of raising (see Interp::eval).
  bool fold = false;
  Expr(ExprKind k, int l) : kind(k), line(l) {}
};

enum class StmtKind : uint8_t {
  kOutput,  // text or expression
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kWith,
  kBreak,
  kContinue,
  kScope,        // {% generation %} and {% block %}: body rendered in its own scope
  kUnsupported,  // {% include %} & co: fail when executed, like jinja2 without a loader
};

// Assignment target: a name, a namespace attribute (ns.attr) or a tuple of targets.
struct Target {
  enum Kind : uint8_t { kName, kNsAttr, kTuple } kind = kName;
  std::string name, attr;
  std::vector<Target> items;
};

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprP> defaults;  // for the last defaults.size() params
  Body body;
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
  bool explicit_caller = false;  // "caller" is one of the params
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;                  // kOutput data; kUnsupported message
  ExprP expr;                        // kOutput expression, kIf test, kFor iterable, kSet value, kCallBlock call
  ExprP test;                        // kFor filter
  ExprP filter;                      // kSetBlock / kFilterBlock filter chain (innermost node has a==nullptr)
  Target target;                     // kFor, kSet, kSetBlock
  Body body, else_body;              // kIf: else_body holds elif chain as a nested kIf
  bool recursive = false;            // kFor
  bool block_scope = false;          // kScope: {% block %} sees only template-level names
  std::shared_ptr<MacroDef> macro;   // kMacro, kCallBlock (the caller)
  std::vector<Target> with_targets;  // kWith
  std::vector<ExprP> with_values;
  Stmt(StmtKind k, int l) : kind(k), line(l) {}
};

}  // namespace pg::jinja
