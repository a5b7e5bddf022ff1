#pragma once
// The part of every c10d communicator that does not depend on the backend: the TCPStore
// rendezvous, the world group and sub-groups, each on its own prefix of the store.

#include <memory>
#include <string>
#include <vector>

#include "trainyard/api/communicator.hpp"

namespace trainyard {

class C10dCommunicator : public Communicator {
 public:
  void connect(const Rendezvous& rendezvous, const c10::Device& device) override;
  int rank() const override { return rendezvous_.rank; }
  int world_size() const override { return rendezvous_.world_size; }
  c10::intrusive_ptr<c10d::Backend> world() override { return world_; }
  c10::intrusive_ptr<c10d::Backend> new_group(const std::vector<int>& ranks) override;
  void barrier() override;
  c10::intrusive_ptr<c10d::Store> store() override { return store_; }

 protected:
  // A backend of `size` ranks in which this process is `rank`, meeting its peers through
  // `store` (already prefixed for the group).
  virtual c10::intrusive_ptr<c10d::Backend> create_backend(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int size) = 0;
  const Rendezvous& rendezvous() const { return rendezvous_; }
  const c10::Device& device() const { return device_; }

 private:
  Rendezvous rendezvous_;
  c10::Device device_ = c10::Device(c10::kCPU);
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> world_;
  int groups_created_ = 0;
};

}  // namespace trainyard
