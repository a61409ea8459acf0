// CudaStream: host work and event completions ride cudaLaunchHostFunc callbacks. A callback only
// runs host work, completes an EventState (whose waiters post to executors) and hands itself
// to the stream's retired list: what it owns (events, captured buffers) may call CUDA when
// destroyed, so it is destroyed later on an ordinary thread, never on CUDA's callback thread.
#include "streams/cuda_stream.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gpu/cuda/cuda_check.h"

namespace specula::streams {
namespace {

void cuda_check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) +
                           ": " + cudaGetErrorString(status) +
                           " (is a CUDA GPU present and the driver loaded?)");
}
#define SPECULA_CUDA_CHECK(call) \
  (::specula::cuda::refuse_in_host_callback(#call), cuda_check((call), #call, __FILE__, __LINE__))

// An EventState with its cudaEvent_t, so that another CUDA stream can wait on the GPU.
class CudaEventState final : public EventState {
 public:
  CudaEventState() { SPECULA_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~CudaEventState() override { cudaEventDestroy(event_); }
  cudaEvent_t event() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace

struct CudaStream::Impl {
  // What one cudaLaunchHostFunc callback does: run `work`, or complete `completes`.
  struct HostCall {
    Impl* impl;
    std::function<void()> work;
    std::shared_ptr<EventState> completes;
  };

  int device = 0;
  std::string name;
  cudaStream_t stream = nullptr;
  bool owned = true;  // destroy `stream` with this object

  std::mutex mutex;
  std::exception_ptr failure;                       // under mutex: first since the last event
  std::vector<std::unique_ptr<HostCall>> retired;   // under mutex: done, to destroy off-callback

  static void CUDART_CB run_host_call(void* arg) {
    auto* call = static_cast<HostCall*>(arg);
    Impl& impl = *call->impl;
    if (call->work) {
      try {
        struct Flag {  // CUDA calls from `work` refuse (cuda_check.h) instead of hanging
          Flag() { cuda::in_host_callback = true; }
          ~Flag() { cuda::in_host_callback = false; }
        } flag;
        call->work();
      } catch (...) {
        std::lock_guard lock(impl.mutex);
        if (!impl.failure) impl.failure = std::current_exception();
      }
    }
    if (call->completes) {
      std::exception_ptr failure;
      {
        std::lock_guard lock(impl.mutex);
        failure = std::exchange(impl.failure, nullptr);
      }
      call->completes->complete(failure);
    }
    std::lock_guard lock(impl.mutex);
    impl.retired.emplace_back(call);
  }

  void launch(std::unique_ptr<HostCall> call) {
    destroy_retired();
    SPECULA_CUDA_CHECK(cudaLaunchHostFunc(stream, run_host_call, call.get()));
    call.release();  // owned by the callback until it retires itself
  }

  void destroy_retired() {
    std::vector<std::unique_ptr<HostCall>> done;
    {
      std::lock_guard lock(mutex);
      done.swap(retired);
    }
  }
};

CudaStream::CudaStream(int device, std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  impl_->name = std::move(name);
  SPECULA_CUDA_CHECK(cudaSetDevice(device));
  SPECULA_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
}

CudaStream::CudaStream(int device, void* native, std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  impl_->name = std::move(name);
  impl_->stream = static_cast<cudaStream_t>(native);
  impl_->owned = false;
  SPECULA_CUDA_CHECK(cudaSetDevice(device));
}

CudaStream::~CudaStream() {
  cudaSetDevice(impl_->device);
  const cudaError_t status = cudaStreamSynchronize(impl_->stream);
  if (status != cudaSuccess) {
    std::fprintf(stderr, "specula: stream '%s': cudaStreamSynchronize at destruction: %s\n",
                 impl_->name.c_str(), cudaGetErrorString(status));
  }
  impl_->destroy_retired();
  if (impl_->failure) {
    std::fprintf(stderr, "specula: stream '%s': host work failed and no later event reported it\n",
                 impl_->name.c_str());
  }
  if (impl_->owned) cudaStreamDestroy(impl_->stream);
}

const std::string& CudaStream::name() const { return impl_->name; }
int CudaStream::device() const { return impl_->device; }
void* CudaStream::native() const { return impl_->stream; }

void CudaStream::enqueue(std::function<void()> work) {
  SPECULA_CUDA_CHECK(cudaSetDevice(impl_->device));
  impl_->launch(std::make_unique<Impl::HostCall>(Impl::HostCall{impl_.get(), std::move(work), nullptr}));
}

Event CudaStream::record() {
  SPECULA_CUDA_CHECK(cudaSetDevice(impl_->device));
  auto state = std::make_shared<CudaEventState>();
  SPECULA_CUDA_CHECK(cudaEventRecord(state->event(), impl_->stream));
  impl_->launch(std::make_unique<Impl::HostCall>(Impl::HostCall{impl_.get(), nullptr, state}));
  return Event(std::move(state));
}

void CudaStream::wait(const Event& event) {
  if (auto* cuda = dynamic_cast<const CudaEventState*>(event.state().get())) {
    SPECULA_CUDA_CHECK(cudaSetDevice(impl_->device));
    SPECULA_CUDA_CHECK(cudaStreamWaitEvent(impl_->stream, cuda->event(), 0));
    return;
  }
  if (event.ready()) return;
  throw std::invalid_argument("CUDA stream '" + impl_->name +
                              "' cannot wait on an unfinished event of another device; "
                              "wait for it on the host first");
}

}  // namespace specula::streams
