#pragma once
// Mapping the tensors inside boxed operator arguments (shared by the dense
// fallback and the sparse host path).
#include <ATen/core/ivalue.h>

namespace neuronx {

// Tensor, Tensor?, Tensor[] and Tensor?[] types.
inline bool is_tensor_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::TensorType) return true;
  if (auto o = t->cast<c10::OptionalType>()) return is_tensor_type(o->getElementType());
  if (auto l = t->cast<c10::ListType>()) return is_tensor_type(l->getElementType());
  return false;
}

// Applies f(tensor, position) to every tensor inside an IValue (tensor, tensor list, list of
// optional tensors), returning the IValue with the mapped tensors; position is the index in
// the list, -1 for a lone tensor. A list is always a new one.
template <typename F>
c10::IValue map_tensors_indexed(const c10::IValue& v, F&& f) {
  if (v.isTensor()) return f(v.toTensor(), -1);
  if (v.isList()) {
    auto list = v.toList();
    const auto& et = list.elementType();
    if (!is_tensor_type(et)) return v;
    c10::impl::GenericList out(et);
    out.reserve(list.size());
    int pos = 0;
    for (const c10::IValue& e : list) {
      out.push_back(e.isTensor() ? c10::IValue(f(e.toTensor(), pos)) : e);
      ++pos;
    }
    return out;
  }
  return v;
}

template <typename F>
c10::IValue map_tensors(const c10::IValue& v, F&& f) {
  return map_tensors_indexed(v, [&](const at::Tensor& t, int) { return f(t); });
}

}  // namespace neuronx
