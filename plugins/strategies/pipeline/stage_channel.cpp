#include "stage_channel.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "trainyard/parallel/distributed.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

// A spec as int64 values: count, then per tensor the name's length and bytes, the dtype, the
// rank and the sizes.
std::vector<std::int64_t> encode(const std::vector<TravellingTensor>& spec) {
  std::vector<std::int64_t> out{static_cast<std::int64_t>(spec.size())};
  for (const auto& tensor : spec) {
    out.push_back(static_cast<std::int64_t>(tensor.name.size()));
    for (char c : tensor.name) out.push_back(static_cast<unsigned char>(c));
    out.push_back(static_cast<std::int64_t>(tensor.dtype));
    out.push_back(static_cast<std::int64_t>(tensor.shape.size()));
    out.insert(out.end(), tensor.shape.begin(), tensor.shape.end());
  }
  return out;
}

std::vector<TravellingTensor> decode(const at::Tensor& values) {
  const at::Tensor host = values.cpu();
  const std::int64_t* data = host.data_ptr<std::int64_t>();
  const std::int64_t size = host.numel();
  std::int64_t at = 0;
  auto next = [&]() {
    if (at >= size) throw Error("pipeline: a malformed bundle spec arrived from a peer stage");
    return data[at++];
  };
  std::vector<TravellingTensor> spec(static_cast<std::size_t>(next()));
  for (auto& tensor : spec) {
    const std::int64_t length = next();
    for (std::int64_t i = 0; i < length; ++i) tensor.name.push_back(static_cast<char>(next()));
    tensor.dtype = static_cast<at::ScalarType>(next());
    const std::int64_t dims = next();
    for (std::int64_t i = 0; i < dims; ++i) tensor.shape.push_back(next());
  }
  return spec;
}

void wait_for(const c10::intrusive_ptr<c10d::Work>& work) {
  CollectiveWait waiting;
  work->wait();
}

}  // namespace

StageChannel::StageChannel(c10::intrusive_ptr<c10d::Backend> group,
                           c10::intrusive_ptr<c10d::Backend> return_group, at::Device device)
    : group_(std::move(group)), return_group_(std::move(return_group)), device_(device) {
  if (!return_group_) return_group_ = group_;
}

c10d::Backend& StageChannel::group_of(StageMessage kind) const {
  return kind == StageMessage::kGradient ? *return_group_ : *group_;
}

StageChannel::~StageChannel() = default;

int StageChannel::tag_of(StageMessage kind, int stage, int micro_batch, bool spec) {
  if (stage >= 256 || micro_batch >= 65536) {
    throw Error("pipeline: stage " + std::to_string(stage) + " micro-batch " +
                std::to_string(micro_batch) + " is past the 256 stages and 65536 micro-batches " +
                "a message tag can name");
  }
  return ((static_cast<int>(kind) + (spec ? 8 : 0)) << 24) | (stage << 16) | micro_batch;
}

void StageChannel::send(const Activations& bundle, int peer, StageMessage kind, int stage,
                        int micro_batch, std::int64_t rows) {
  // Sends that have completed release their tensors (gradients sent back, whose arrival
  // nothing on this side observes).
  std::erase_if(sends_, [](const Send& send) { return send.work->isCompleted(); });
  std::vector<TravellingTensor> spec;
  std::vector<at::Tensor> tensors;
  for (const auto& [name, tensor] : bundle.tensors) {
    tensors.push_back(tensor.detach().contiguous());
    spec.push_back({name, tensor.scalar_type(), tensor.sizes().vec()});
  }
  const auto key = std::make_tuple(peer, static_cast<int>(kind), stage, rows);
  auto known = sent_specs_.find(key);
  if (known == sent_specs_.end()) {
    const std::vector<std::int64_t> values = encode(spec);
    at::Tensor length =
        at::tensor({static_cast<std::int64_t>(values.size())}, at::kLong).to(device_);
    at::Tensor body = at::tensor(values, at::kLong).to(device_);
    const int spec_tag = tag_of(kind, stage, micro_batch, /*spec=*/true);
    for (const at::Tensor& message : {length, body}) {
      std::vector<at::Tensor> one{message};
      sends_.push_back({group_of(kind).send(one, peer, spec_tag), message, peer, spec_tag});
    }
    sent_specs_.emplace(key, spec);
  } else {
    bool same = known->second.size() == spec.size();
    for (std::size_t i = 0; same && i < spec.size(); ++i) {
      same = known->second[i].name == spec[i].name && known->second[i].dtype == spec[i].dtype &&
             known->second[i].shape == spec[i].shape;
    }
    if (!same) {
      throw Error("pipeline: stage " + std::to_string(stage) +
                  " sends a bundle whose tensors differ from what it sent before for micro-" +
                  "batches of " + std::to_string(rows) +
                  " samples: a stage's output must have the same shapes for equal batch sizes");
    }
  }
  const int tag = tag_of(kind, stage, micro_batch, false);
  for (at::Tensor& tensor : tensors) {
    std::vector<at::Tensor> one{tensor};
    sends_.push_back({group_of(kind).send(one, peer, tag), tensor, peer, tag});
  }
}

StageChannel::Pending StageChannel::receive(int peer, StageMessage kind, int stage, int micro_batch,
                                            std::int64_t rows) {
  Pending pending;
  pending.peer = peer;
  pending.kind = kind;
  pending.tag = tag_of(kind, stage, micro_batch, false);
  pending.key = std::make_tuple(peer, static_cast<int>(kind), stage, rows);
  auto known = received_specs_.find(pending.key);
  if (known != received_specs_.end()) {
    pending.spec = known->second;
    post(pending);
  }
  return pending;
}

void StageChannel::post(Pending& pending) {
  for (const auto& tensor : pending.spec) {
    pending.buffers.push_back(
        at::empty(tensor.shape, at::TensorOptions().dtype(tensor.dtype).device(device_)));
    std::vector<at::Tensor> one{pending.buffers.back()};
    pending.works.push_back(group_of(pending.kind).recv(one, pending.peer, pending.tag));
  }
  pending.posted = true;
}

Activations StageChannel::wait(Pending& pending) {
  if (!pending.posted) {
    if (auto known = received_specs_.find(pending.key); known != received_specs_.end()) {
      pending.spec = known->second;  // an earlier wait received it
      post(pending);
    }
  }
  if (!pending.posted) {
    // The first bundle of its kind and size: its spec comes first, from the same tag space.
    const int spec_tag = pending.tag | (8 << 24);
    std::vector<at::Tensor> length{
        at::empty({1}, at::TensorOptions().dtype(at::kLong).device(device_))};
    wait_for(group_of(pending.kind).recv(length, pending.peer, spec_tag));
    std::vector<at::Tensor> body{at::empty({length[0].cpu().item<std::int64_t>()},
                                           at::TensorOptions().dtype(at::kLong).device(device_))};
    wait_for(group_of(pending.kind).recv(body, pending.peer, spec_tag));
    pending.spec = decode(body[0]);
    received_specs_.emplace(pending.key, pending.spec);
    post(pending);
  }
  for (const auto& work : pending.works) wait_for(work);
  Activations bundle;
  for (std::size_t i = 0; i < pending.spec.size(); ++i) {
    bundle.tensors.emplace(pending.spec[i].name, pending.buffers[i]);
  }
  pending.works.clear();
  return bundle;
}

void StageChannel::wait_sends() {
  for (const auto& send : sends_) wait_for(send.work);
  sends_.clear();
}

void StageChannel::release_sent(int peer, StageMessage kind, int stage, int micro_batch) {
  const int tag = tag_of(kind, stage, micro_batch, /*spec=*/false);
  std::erase_if(sends_, [&](const Send& send) {
    if (send.peer != peer || send.tag != tag) return false;
    wait_for(send.work);
    return true;
  });
}

}  // namespace trainyard
