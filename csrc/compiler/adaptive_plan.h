#pragma once
// Adaptive eager's plan of one group: which queued kernels join the one the engine took, the
// values they read and write (found by their device addresses), and the group's key.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compiler/adaptive_eager.h"
#include "compiler/graph.h"
#include "compiler/passes.h"
#include "runtime/kernel.h"
#include "runtime/queue.h"

namespace neuronx::compiler::adaptive {

enum class End : uint8_t {
#define NEURONX_ENUM(name, why) k_##name,
  NEURONX_ADAPTIVE_ENDS(NEURONX_ENUM)
#undef NEURONX_ENUM
      kCount
};
const char* end_name(End e);

struct Plan {
  struct Operand {
    enum class Kind : uint8_t { kValue, kScalar, kConstant } kind = Kind::kConstant;
    int index = -1;          // kValue: value id; kScalar: index into scalars
    c10::IValue constant;    // kConstant
  };
  struct Member {
    OpId id = OpId::kOther;  // the functional op (an in-place op computes it into its self)
    std::optional<c10::OperatorHandle> op;
    std::vector<Operand> operands;
    int output = -1;         // the value it defines
  };
  struct Slot {              // a device buffer the group reads or writes
    char* ptr = nullptr;
    int current = -1;        // the value it holds at this point of the group
    int input = -1;          // the value it held before the group (read from memory), or -1
  };
  size_t members = 0;                  // the kernel taken included
  End end = End::k_queue_end;
  std::vector<Member> nodes;
  std::vector<Slot> slots;
  std::vector<int> value_slot;         // per value: its slot
  std::vector<char> value_dead;        // per value: a new output nothing references any more
  std::vector<double> scalars;
  std::vector<int64_t> sizes;          // of every operand (contiguous, one dtype)
  int64_t numel = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  int64_t item = 4;                    // bytes per element
  std::string key;                     // structure; scalars are arguments, not part of it

  void clear();
  // Inputs (values read from memory) and outputs (each written slot's last value, unless dead):
  // the kernel's pointers, in the order to_graph's group lists them.
  std::vector<int> inputs() const;
  std::vector<int> outputs() const;
  int dead_outputs() const;  // written slots whose last value is dead: not stored
};

// Whether k could start a group (an op kernel whose op fuses): cheap, under the engine's lock.
bool is_candidate(const rt::Kernel& k);
// Plans the group starting at head over its followers; p.members is 1 when nothing joins.
void make_plan(const rt::Kernel& head, const rt::GroupWindow& w, Plan& p);
// The plan's program as a compiler graph, and its one fusion group (code generation's input).
Graph to_graph(const Plan& p, FusionGroup& group);

}  // namespace neuronx::compiler::adaptive
