#include "gtest/gtest.h"
#include "proto/samplerd.grpc.pb.h"
#include "proto/samplerd.pb.h"

TEST(ProtoTest, RoundTrip) {
  samplerd::v1::JobSpec spec;
  spec.set_num_samples(uint64_t{1} << 33);
  std::string bytes;
  ASSERT_TRUE(spec.SerializeToString(&bytes));
  samplerd::v1::JobSpec back;
  ASSERT_TRUE(back.ParseFromString(bytes));
  EXPECT_EQ(back.num_samples(), uint64_t{1} << 33);
}
