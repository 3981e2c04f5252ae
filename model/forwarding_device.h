// ForwardingDevice: a Device that passes every call to another device, for wrappers that
// observe or change a few calls (a profiler of kernels, a test device that poisons memory) and
// override only those. The inner device must outlive the wrapper.
#ifndef SHARDGPT_MODEL_FORWARDING_DEVICE_H_
#define SHARDGPT_MODEL_FORWARDING_DEVICE_H_

#include <memory>
#include <string>

#include "model/device.h"

namespace shardgpt {

class ForwardingDevice : public Device {
 public:
  explicit ForwardingDevice(Device& inner) : d_(inner) {}
  Device& inner() { return d_; }
  std::string name() const override { return d_.name(); }
  bool is_cuda() const override { return d_.is_cuda(); }
  bool host_accessible() const override { return d_.host_accessible(); }
  void* Allocate(size_t bytes, const std::string& what) override { return d_.Allocate(bytes, what); }
  void* AllocateUnfilled(size_t bytes, const std::string& what) override { return d_.AllocateUnfilled(bytes, what); }
  void Free(void* p) override { d_.Free(p); }
  uint64_t free_bytes() const override { return d_.free_bytes(); }
  DeviceCounters counters() const override { return d_.counters(); }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override { d_.CopyToDevice(dst, src, bytes); }
  void CopyToDeviceAsync(void* dst, const void* src, size_t bytes) override { d_.CopyToDeviceAsync(dst, src, bytes); }
  void CopyToHost(void* dst, const void* src, size_t bytes) override { d_.CopyToHost(dst, src, bytes); }
  void Copy(void* dst, const void* src, size_t bytes) override { d_.Copy(dst, src, bytes); }
  void Zero(void* p, size_t bytes) override { d_.Zero(p, bytes); }
  void Synchronize() override { d_.Synchronize(); }
  std::shared_ptr<DeviceEvent> RecordEvent() override { return d_.RecordEvent(); }
  void* AllocateHost(size_t bytes) override { return d_.AllocateHost(bytes); }
  void FreeHost(void* p) override { d_.FreeHost(p); }
  void StageToHost(void* dst, const void* src, size_t bytes) override { d_.StageToHost(dst, src, bytes); }
  void StageToDevice(void* dst, const void* src, size_t bytes) override { d_.StageToDevice(dst, src, bytes); }
  Kernels& kernels() override { return d_.kernels(); }

 private:
  Device& d_;
};

}  // namespace shardgpt

#endif  // SHARDGPT_MODEL_FORWARDING_DEVICE_H_
