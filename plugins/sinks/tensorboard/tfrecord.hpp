#pragma once
// TFRecord framing, the container of TensorBoard event files: each record is its length
// (uint64, little endian), the masked CRC-32C of the length, the data, and the masked CRC-32C of
// the data.

#include <cstdint>
#include <string>
#include <string_view>

namespace trainyard::tensorboard {

// CRC-32C (Castagnoli), as TFRecord checksums use it.
std::uint32_t crc32c(std::string_view data);

// TFRecord stores checksums rotated and offset, so that a CRC of data holding CRCs stays
// well-behaved.
std::uint32_t masked_crc32c(std::string_view data);

// `data` framed as one TFRecord.
std::string tfrecord(std::string_view data);

}  // namespace trainyard::tensorboard
