#pragma once
#include "backend/common.h"
namespace neuronx {
at::Tensor copy_from(const at::Tensor& src, const at::Tensor& dst, bool non_blocking);
at::Tensor copy_from_and_resize(const at::Tensor& src, const at::Tensor& dst);
}  // namespace neuronx
