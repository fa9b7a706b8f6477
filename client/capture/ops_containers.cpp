// Opcode handlers for containers: building tuples, lists, sets, dicts, slices and strings,
// subscripts, comprehension appends, and unpacking.
#include "capture/translator.h"

namespace kiln::capture {

bool Translator::OpBinarySubscr(const Instruction& inst) {
  py::object index = Pop();
  py::object obj = Pop();
  Push(obj.attr("getitem")(Self(), index));
  return false;
}

bool Translator::OpBinarySlice(const Instruction& inst) {
  // 3.12
  py::object end = Pop();
  py::object start = Pop();
  py::object obj = Pop();
  Push(obj.attr("getitem")(Self(), host_->SliceVariable(py::make_tuple(start, end))));
  return false;
}

bool Translator::OpStoreSubscr(const Instruction& inst) {
  py::object index = Pop();
  py::object obj = Pop();
  py::object value = Pop();
  obj.attr("setitem")(Self(), index, value);
  return false;
}

bool Translator::OpDeleteSubscr(const Instruction& inst) {
  py::object index = Pop();
  py::object obj = Pop();
  obj.attr("delitem")(Self(), index);
  return false;
}

bool Translator::OpStoreSlice(const Instruction& inst) {
  // 3.12
  py::object end = Pop();
  py::object start = Pop();
  py::object obj = Pop();
  py::object value = Pop();
  obj.attr("setitem")(Self(), host_->SliceVariable(py::make_tuple(start, end)), value);
  return false;
}

bool Translator::OpBuildTuple(const Instruction& inst) {
  Push(host_->TupleVariable(ListOf(PopN(inst.arg))));
  return false;
}

bool Translator::OpBuildList(const Instruction& inst) {
  Push(host_->ListVariable(ListOf(PopN(inst.arg))));
  return false;
}

bool Translator::OpBuildSet(const Instruction& inst) {
  py::set items;
  for (const py::object& item : PopN(inst.arg)) items.add(AsConstant(item));
  Push(host_->SetVariable(items));
  return false;
}

bool Translator::OpBuildMap(const Instruction& inst) {
  // Keys may be constants or objects a dict compares by identity (a tensor, a module): the
  // tracker keys them as the dict would (ConstDictVariable.built).
  std::vector<py::object> items = PopN(static_cast<size_t>(inst.arg) * 2);
  Push(host_->ConstDictVariable.attr("built")(Self(), ListOf(items)));
  return false;
}

bool Translator::OpBuildConstKeyMap(const Instruction& inst) {
  py::tuple keys(AsConstant(Pop()));
  std::vector<py::object> values = PopN(inst.arg);
  py::dict d;
  for (size_t i = 0; i < values.size() && i < keys.size(); ++i) d[keys[i]] = values[i];
  Push(host_->ConstDictVariable(d));
  return false;
}

bool Translator::OpBuildSlice(const Instruction& inst) {
  Push(host_->SliceVariable(ListOf(PopN(inst.arg))));
  return false;
}

bool Translator::OpBuildString(const Instruction& inst) {
  std::string joined;
  for (const py::object& part : PopN(inst.arg)) joined += Str(AsConstant(part));
  Push(Constant(py::str(joined)));
  return false;
}

bool Translator::OpFormatValue(const Instruction& inst) {
  py::object spec = (inst.arg & 0x04) ? AsConstant(Pop()) : py::object(py::str(""));
  py::object value = AsConstant(Pop());
  switch (inst.arg & 0x03) {
    case 1:
      value = py::str(value);
      break;
    case 2:
      value = py::repr(value);
      break;
    case 3:
      value = py::reinterpret_steal<py::object>(PyObject_ASCII(value.ptr()));
      if (!value) throw py::error_already_set();
      break;
    default:
      break;
  }
  py::object formatted =
      py::reinterpret_steal<py::object>(PyObject_Format(value.ptr(), spec.ptr()));
  if (!formatted) throw py::error_already_set();
  Push(Constant(formatted));
  return false;
}

bool Translator::OpListAppend(const Instruction& inst) {
  py::object value = Pop();
  Peek(inst.arg).attr("items").attr("append")(value);
  return false;
}

bool Translator::OpListExtend(const Instruction& inst) {
  py::object value = Pop();
  Peek(inst.arg).attr("items").attr("extend")(Unpack(value));
  return false;
}

bool Translator::OpListToTuple(const Instruction& inst) {
  Push(host_->TupleVariable(Unpack(Pop())));
  return false;
}

bool Translator::OpSetUpdate(const Instruction& inst) {
  py::object value = Pop();
  Peek(inst.arg).attr("value").attr("update")(AsConstant(value));
  return false;
}

bool Translator::OpSetAdd(const Instruction& inst) {
  py::object value = Pop();
  Peek(inst.arg).attr("value").attr("add")(AsConstant(value));  // the comprehension's own set
  return false;
}

bool Translator::OpMapAdd(const Instruction& inst) {
  py::object value = Pop();
  py::object key = Pop();
  Peek(inst.arg).attr("map_add")(Self(), key, value);
  return false;
}

bool Translator::OpDictUpdate(const Instruction& inst) {
  py::object value = Pop();
  py::object target = Peek(inst.arg);
  target.attr("update_from")(Self(), value);  // which refuses a non-dict
  return false;
}

bool Translator::OpUnpackSequence(const Instruction& inst) {
  py::list items(Unpack(Pop()));
  if (static_cast<int>(items.size()) != inst.arg) {
    Unsupported("unpacking " + std::to_string(items.size()) + " values into " +
                std::to_string(inst.arg));
  }
  for (size_t i = items.size(); i-- > 0;) Push(items[i]);
  return false;
}

bool Translator::OpUnpackEx(const Instruction& inst) {
  py::list items(Unpack(Pop()));
  const size_t before = inst.arg & 0xFF;
  const size_t after = inst.arg >> 8;
  const size_t n = items.size();
  if (n < before + after) Unsupported("not enough values to unpack");
  for (size_t i = n; i-- > n - after;) Push(items[i]);
  py::list middle;
  for (size_t i = before; i < n - after; ++i) middle.append(items[i]);
  Push(host_->ListVariable(middle));
  for (size_t i = before; i-- > 0;) Push(items[i]);
  return false;
}

}  // namespace kiln::capture
