// Internal to the restricted unpickler (pickle_reader.cpp, pickle_globals.cpp): what the known
// globals mean. `where` prefixes every error ("FILE: pickle opcode at byte N: ").
#pragma once

#include <string>

#include "core/pickle.h"

namespace megatron::pickle::detail {

// GLOBAL / STACK_GLOBAL: a class or function reference, or an Error naming a global the reader
// does not know (nothing is ever imported or called).
Value* make_global(Document& doc, const std::string& module, const std::string& name,
                   const std::string& where);
// REDUCE: the value a known global builds from `args`.
Value* call_global(Document& doc, Value* f, Value* args, const std::string& where);
// NEWOBJ: argparse.Namespace, OrderedDict, io.BytesIO.
Value* new_object(Document& doc, Value* cls, Value* args, const std::string& where);
// BUILD: an object's state (Namespace attributes, NumPy arrays and dtypes, ...).
void build_object(Value* obj, Value* state, const std::string& where);
// BINPERSID: a torch storage reference ('storage', type, key, location, numel[, view]).
Value* storage_reference(Document& doc, Value* pid, const std::string& where);

}  // namespace megatron::pickle::detail
