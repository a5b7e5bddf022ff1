#pragma once
// The mutable state of one encoding call (regex match data, the word cache, merge buffers),
// taken from a tokenizer's pool for the call and given back after it, so that concurrent calls
// never share one.

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "bpe_model.hpp"
#include "regex.hpp"

namespace trainyard {

struct EncodeScratch {
  RegexScratch regex;
  BpeScratch bpe;
  std::vector<std::uint32_t> sequence;  // the ids before a post-processor's template
};

class ScratchPool {
 public:
  class Lease {
   public:
    Lease(ScratchPool& pool, std::unique_ptr<EncodeScratch> scratch)
        : pool_(pool), scratch_(std::move(scratch)) {}
    ~Lease() { pool_.give_back(std::move(scratch_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    EncodeScratch& operator*() const { return *scratch_; }

   private:
    ScratchPool& pool_;
    std::unique_ptr<EncodeScratch> scratch_;
  };

  Lease take() {
    std::unique_ptr<EncodeScratch> scratch;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        scratch = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (!scratch) scratch = std::make_unique<EncodeScratch>();
    return Lease(*this, std::move(scratch));
  }

 private:
  void give_back(std::unique_ptr<EncodeScratch> scratch) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(std::move(scratch));
  }
  std::mutex mutex_;
  std::vector<std::unique_ptr<EncodeScratch>> free_;
};

}  // namespace trainyard
