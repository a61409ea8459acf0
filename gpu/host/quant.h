// Reference (scalar) dequantization of the stored types; fast kernels are tested against it.
#pragma once
#include <cstdint>

#include "model/tensor.h"

namespace specula {

float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  // round to nearest even

// dst[0..cols) = the values of one stored row. cols is a multiple of the type's block size.
void dequantize_row(DType t, const void* src, float* dst, int64_t cols);

}  // namespace specula
