// The allowlisted subset of the torch C++ API a KernelBench CUDA answer may use, declared with torch's own
// signatures (declarations only: on a CPU the answer is compiled to an object file, never linked or run).
// `kernels_eval.kernelbench.answers` puts this text in place of the answer's torch includes; a call outside
// it fails to compile ("not declared"), which is how library calls (torch::matmul, ...) are refused.
#include <cstdint>
#include <cstddef>
#include <vector>
#include <initializer_list>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace c10 {
enum class ScalarType : int8_t { Byte, Char, Short, Int, Long, Half, Float, Double, Bool, BFloat16 };
enum class DeviceType : int8_t { CPU, CUDA };
struct Device { Device(DeviceType type, int8_t index = -1); DeviceType type() const; int8_t index() const; };
class IntArrayRef {
 public:
  IntArrayRef(std::initializer_list<int64_t> list);
  IntArrayRef(const std::vector<int64_t>& vec);
  const int64_t* data() const;
  size_t size() const;
  int64_t operator[](size_t i) const;
  std::vector<int64_t> vec() const;
};
class TensorOptions {
 public:
  TensorOptions();
  TensorOptions dtype(ScalarType dtype) const;
  TensorOptions device(Device device) const;
};
}  // namespace c10

namespace at {
using c10::Device;
using c10::IntArrayRef;
using c10::ScalarType;
using c10::TensorOptions;
constexpr ScalarType kFloat = ScalarType::Float, kHalf = ScalarType::Half, kBFloat16 = ScalarType::BFloat16,
                     kInt = ScalarType::Int, kLong = ScalarType::Long, kBool = ScalarType::Bool,
                     kDouble = ScalarType::Double;
constexpr c10::DeviceType kCUDA = c10::DeviceType::CUDA;
class Tensor {
 public:
  int64_t size(int64_t dim) const;
  IntArrayRef sizes() const;
  int64_t stride(int64_t dim) const;
  IntArrayRef strides() const;
  int64_t numel() const;
  int64_t dim() const;
  int64_t ndimension() const;
  template <typename T> T* data_ptr() const;
  template <typename T> T* mutable_data_ptr() const;
  template <typename T> const T* const_data_ptr() const;
  TensorOptions options() const;
  ScalarType scalar_type() const;
  Device device() const;
  bool is_cuda() const;
  bool is_contiguous() const;
  Tensor contiguous() const;
  Tensor view(IntArrayRef size) const;
  Tensor reshape(IntArrayRef shape) const;
};
Tensor empty(IntArrayRef size, TensorOptions options = {});
Tensor zeros(IntArrayRef size, TensorOptions options = {});
Tensor empty_like(const Tensor& self);
Tensor empty_like(const Tensor& self, TensorOptions options);
Tensor zeros_like(const Tensor& self);
Tensor zeros_like(const Tensor& self, TensorOptions options);
namespace cuda {
struct CUDAStream { operator cudaStream_t() const; cudaStream_t stream() const; };
CUDAStream getCurrentCUDAStream(int8_t device_index = -1);
}  // namespace cuda
}  // namespace at

namespace torch {
using at::Device;
using at::empty;
using at::empty_like;
using at::IntArrayRef;
using at::ScalarType;
using at::Tensor;
using at::TensorOptions;
using at::zeros;
using at::zeros_like;
constexpr ScalarType kFloat32 = ScalarType::Float, kFloat = ScalarType::Float, kFloat16 = ScalarType::Half,
                     kHalf = ScalarType::Half, kBFloat16 = ScalarType::BFloat16, kInt32 = ScalarType::Int,
                     kInt = ScalarType::Int, kInt64 = ScalarType::Long, kLong = ScalarType::Long,
                     kBool = ScalarType::Bool;
constexpr c10::DeviceType kCUDA = c10::DeviceType::CUDA;
}  // namespace torch

#define TORCH_CHECK(cond, ...) ((void)(cond))
