#include "nki/target.h"

#include <cstdlib>
#include <stdexcept>

namespace neuronx::nki {

namespace {

Target make_target() {
  const char* env = std::getenv("NEURON_PLATFORM_TARGET_OVERRIDE");
  std::string name = env && *env ? env : "trn2";
  Target t;
  t.name = name;
  if (name == "trn1" || name == "inf2") {
    t.nc_version = 2;
    t.sbuf_partition_bytes = 192 * 1024;
  } else if (name == "trn2") {
    t.nc_version = 3;
    t.sbuf_partition_bytes = 224 * 1024;
  } else if (name == "trn3") {
    t.nc_version = 4;
    t.sbuf_partition_bytes = 224 * 1024;
  } else {
    throw std::invalid_argument("NEURON_PLATFORM_TARGET_OVERRIDE=" + name +
                                " is not a NeuronCore target; use trn1, trn2 or trn3");
  }
  return t;
}

Target& current() {
  static Target t = make_target();
  return t;
}

}  // namespace

const Target& target() { return current(); }

const Target& reload_target() {
  current() = make_target();
  return current();
}

}  // namespace neuronx::nki
