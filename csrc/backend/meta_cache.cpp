#include "backend/meta_cache.h"
#include "backend/small_index.h"

#include <c10/core/DefaultDtype.h>

#include <cstring>


namespace neuronx {

namespace {

template <typename T>
void put(std::string& k, const T& v) {
  k.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// 7 bits a byte, high bit set on all but the last: no width to wrap.
void put_varint(std::string& k, size_t v) {
  while (v >= 0x80) {
    k.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  k.push_back(static_cast<char>(v));
}

// false: not cacheable. Host tensors beyond 0-dim scalars are index tensors,
// whose values (boolean masks) decide the output shape.
bool put_tensor(std::string& k, const at::Tensor& t) {
  if (!t.defined()) {
    k.push_back('U');
    return true;
  }
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const bool on_device = impl->device_type() == kNeuron;
  if (!on_device && impl->dim() > 0) return false;
  // Few appends of whole fields: this runs for every operand of every op.
  struct Header {
    char tag;
    int8_t device_type, dtype;
    uint8_t flags;
    int32_t dim;
  } h{'T', static_cast<int8_t>(impl->device_type()), static_cast<int8_t>(c10::typeMetaToScalarType(impl->dtype())),
      static_cast<uint8_t>((impl->is_wrapped_number() ? 1 : 0) | (impl->is_conj() ? 2 : 0) | (impl->is_neg() ? 4 : 0)),
      static_cast<int32_t>(impl->dim())};
  put(k, h);
  const c10::IntArrayRef sizes = impl->sizes(), strides = impl->strides();
  k.append(reinterpret_cast<const char*>(sizes.data()), sizes.size() * sizeof(int64_t));
  k.append(reinterpret_cast<const char*>(strides.data()), strides.size() * sizeof(int64_t));
  const int64_t tail[2] = {impl->storage_offset(),
                           on_device ? static_cast<int64_t>(impl->unsafe_storage().nbytes()) : int64_t{-1}};
  k.append(reinterpret_cast<const char*>(tail), on_device ? 2 * sizeof(int64_t) : sizeof(int64_t));
  return true;
}

bool put_value(std::string& k, const c10::IValue& v, bool float_values) {
  if (v.isTensor()) {
    if (!put_tensor(k, v.toTensor())) return false;
  } else if (v.isNone()) {
    k.push_back('N');
  } else if (v.isInt()) {
    k.push_back('i');
    put(k, v.toInt());
  } else if (v.isDouble()) {
    k.push_back('d');
    if (float_values) put(k, v.toDouble());
  } else if (v.isBool()) {
    k.push_back('b');
    put(k, v.toBool());
  } else if (v.isComplexDouble()) {
    k.push_back('c');
    if (float_values) put(k, v.toComplexDouble());
  } else if (v.isSymInt()) {
    auto s = v.toSymInt();
    if (s.is_heap_allocated()) return false;
    k.push_back('i');
    put(k, s.as_int_unchecked());
  } else if (v.isString()) {
    k.push_back('s');
    const auto& s = v.toStringRef();
    put(k, static_cast<uint32_t>(s.size()));
    k.append(s);
  } else if (v.isDevice()) {
    k.push_back('D');
    put(k, static_cast<int8_t>(v.toDevice().type()));
    put(k, static_cast<int8_t>(v.toDevice().index()));
  } else if (v.isGenerator()) {
    k.push_back('G');
  } else if (v.isList()) {
    k.push_back('L');
    auto list = v.toListRef();
    put(k, static_cast<uint32_t>(list.size()));
    for (const auto& e : list)
      if (!put_value(k, e, float_values)) return false;
  } else {
    return false;
  }
  return true;
}

}  // namespace

bool MetaCache::make_key(c10::ArrayRef<c10::IValue> args, std::string& key, bool float_values) {
  key.clear();
  // Factory-like ops read the default dtype when dtype=None.
  put(key, static_cast<int8_t>(c10::get_default_dtype_as_scalartype()));
  for (const auto& v : args)
    if (!put_value(key, v, float_values)) return false;
  // Which operands share a storage changes what meta kernels check (overlap),
  // appended after the self-delimiting values so no two keys can run together:
  // each neuron operand gets the index of the first operand with its storage,
  // as a varint (a call may pass thousands of tensors: foreach, cat, stack).
  thread_local SmallIndex<const c10::StorageImpl*, size_t> storages;
  storages.clear();
  for (const auto& v : args) {
    auto note = [&](const at::Tensor& t) {
      if (!t.defined() || t.device().type() != kNeuron) return;
      const c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
      const size_t* cls = storages.find(st);
      put_varint(key, cls ? *cls : storages.put(st, storages.size()));
    };
    if (v.isTensor()) note(v.toTensor());
    else if (v.isList())
      for (const auto& e : v.toListRef())
        if (e.isTensor()) note(e.toTensor());
  }
  return true;
}

void MetaCache::make_dtype_key(c10::ArrayRef<c10::IValue> args, std::string& key) {
  key.clear();
  for (const auto& v : args) {
    auto tensor = [&](const at::Tensor& t) {
      if (!t.defined()) {
        key.push_back('U');
        return;
      }
      key.push_back(t.device().type() == kNeuron ? 'n' : 'h');
      put(key, static_cast<int8_t>(t.scalar_type()));
      if (t.dim() == 0) key.push_back('0');
    };
    if (v.isTensor()) {
      tensor(v.toTensor());
    } else if (v.isList()) {
      key.push_back('[');
      for (const auto& e : v.toListRef()) {
        if (e.isTensor()) tensor(e.toTensor());
        else key.push_back(e.isNone() ? 'N' : 's');
      }
      key.push_back(']');
    } else {
      key.push_back(v.isNone() ? 'N' : v.isInt() ? 'i' : v.isDouble() ? 'd' : v.isBool() ? 'b'
                    : v.isComplexDouble() ? 'c' : 's');
    }
  }
}

std::shared_ptr<const MetaResult> MetaCache::find(const std::string& key) {
  // A loop repeats an op's last signature: each thread remembers, per cache, the last key it
  // found (no lock, no hash). Results are never withdrawn, only evicted, so a remembered one
  // stays the right answer for its key.
  struct Last {
    const MetaCache* cache = nullptr;
    std::string key;
    std::shared_ptr<const MetaResult> result;
  };
  thread_local Last last[32];
  Last& l = last[(reinterpret_cast<uintptr_t>(this) >> 6) & 31];
  if (l.cache == this && l.key == key) return l.result;
  std::shared_ptr<const MetaResult> r;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    r = it->second;
  }
  l.cache = this;
  l.key = key;
  l.result = r;
  return r;
}

void MetaCache::insert(const std::string& key, std::shared_ptr<const MetaResult> r) {
  std::lock_guard<std::mutex> g(mu_);
  if (map_.size() >= kMaxEntries) map_.clear();  // shapes churn: start over rather than grow
  map_.emplace(key, std::move(r));
}

}  // namespace neuronx
