// TFRecord framing of TensorBoard event files: CRC-32C against published check values, the
// mask, and a record's layout.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "tfrecord.hpp"

namespace trainyard::tensorboard {
namespace {

std::uint32_t little_endian_u32(const std::string& bytes, std::size_t at) {
  std::uint32_t value = 0;
  for (int i = 3; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
  return value;
}

TEST(TfRecordTest, Crc32cMatchesPublishedCheckValues) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);            // the CRC catalogue's check value
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720, B.4
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  EXPECT_EQ(crc32c(""), 0u);
}

TEST(TfRecordTest, MaskRotatesAndOffsets) {
  const std::uint32_t crc = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789"),
            static_cast<std::uint32_t>(((crc >> 15) | (crc << 17)) + 0xa282ead8u));
}

TEST(TfRecordTest, RecordIsLengthCrcDataCrc) {
  const std::string data = "brain.Event:2";
  const std::string record = tfrecord(data);
  ASSERT_EQ(record.size(), 8 + 4 + data.size() + 4);
  const std::string length = record.substr(0, 8);
  EXPECT_EQ(length, std::string("\x0d\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(little_endian_u32(record, 8), masked_crc32c(length));
  EXPECT_EQ(record.substr(12, data.size()), data);
  EXPECT_EQ(little_endian_u32(record, 12 + data.size()), masked_crc32c(data));
}

}  // namespace
}  // namespace trainyard::tensorboard
