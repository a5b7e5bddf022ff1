#include "trainyard/parallel/c10d_communicator.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

#include "trainyard/parallel/distributed.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {

void C10dCommunicator::connect(const Rendezvous& rendezvous, const c10::Device& device) {
  if (store_) throw Error("communicator is already connected");
  rendezvous_ = rendezvous;
  device_ = device;
  const char* agent = std::getenv(kAgentStoreVariable);
  const bool agent_hosts = agent && std::strcmp(agent, "True") == 0;
  store_ = open_store(rendezvous, rendezvous.rank == 0 && !agent_hosts);
  world_ = create_backend(c10::make_intrusive<c10d::PrefixStore>("trainyard/world", store_),
                          rendezvous.rank, rendezvous.world_size);
}

c10::intrusive_ptr<c10d::Backend> C10dCommunicator::new_group(const std::vector<int>& ranks) {
  if (!store_) throw Error("new_group before connect");
  std::set<int> unique(ranks.begin(), ranks.end());
  if (ranks.empty() || unique.size() != ranks.size() || *unique.begin() < 0 ||
      *unique.rbegin() >= rendezvous_.world_size) {
    throw Error("new_group needs distinct ranks in [0, " + std::to_string(rendezvous_.world_size) +
                ")");
  }
  // Every rank counts every group, members or not, so the prefixes agree across the job.
  const std::string prefix = "trainyard/group" + std::to_string(groups_created_++);
  auto position = std::find(ranks.begin(), ranks.end(), rendezvous_.rank);
  if (position == ranks.end()) return {};
  return create_backend(c10::make_intrusive<c10d::PrefixStore>(prefix, store_),
                        static_cast<int>(position - ranks.begin()), static_cast<int>(ranks.size()));
}

void C10dCommunicator::barrier() {
  if (!world_) throw Error("barrier before connect");
  CollectiveWait wait;
  world_->barrier()->wait();
}

}  // namespace trainyard
