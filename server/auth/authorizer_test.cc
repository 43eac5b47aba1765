#include "server/auth/authorizer.h"

#include <sys/stat.h>

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/samplerd.pb.h"
#include "server/testing/test_dir.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAdmin[] = "admin-token-0123456789abcdef";
constexpr char kTrain[] = "train-token-0123456789abcdef";
constexpr char kEval[] = "eval-token-0123456789abcdef";

using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

class AuthorizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.path() + "/tokens";
    testutil::WriteBytes(path_, absl::StrCat(kAdmin, " admin\n", kTrain, " jobs=train\n"));
    auto authorizer = Authorizer::Create(path_);
    ASSERT_TRUE(authorizer.ok()) << authorizer.status();
    authorizer_ = *std::move(authorizer);
  }

  // The Caller of a call sending `token` as a bearer token.
  absl::StatusOr<Caller> With(const std::string& token) {
    header_ = absl::StrCat("Bearer ", token);
    return authorizer_->Authenticate(Metadata{{"authorization", header_}});
  }

  testutil::TestDir dir_;
  std::string path_;
  std::string header_;
  std::unique_ptr<Authorizer> authorizer_;
};

TEST_F(AuthorizerTest, CallsWithoutAValidBearerTokenAreUnauthenticated) {
  EXPECT_THAT(std::string(authorizer_->Authenticate(Metadata{}).status().message()),
              HasSubstr("no bearer token"));
  EXPECT_EQ(authorizer_->Authenticate(Metadata{}).status().code(),
            absl::StatusCode::kUnauthenticated);
  const std::string basic = "Basic dXNlcjpwYXNz";
  auto not_bearer = authorizer_->Authenticate(Metadata{{"authorization", basic}});
  EXPECT_EQ(not_bearer.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(not_bearer.status().message()), HasSubstr("not a bearer token"));
  const std::string a = absl::StrCat("Bearer ", kAdmin), b = absl::StrCat("Bearer ", kTrain);
  auto two = authorizer_->Authenticate(Metadata{{"authorization", a}, {"authorization", b}});
  EXPECT_EQ(two.status().code(), absl::StatusCode::kUnauthenticated);
  auto unknown = With("unknown-token-0123456789abcdef");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(unknown.status().message()),
              AllOf(HasSubstr("not one of --auth_tokens_file"), Not(HasSubstr("unknown-token"))));
  // RFC 6750: the scheme is case-insensitive.
  const std::string lower = absl::StrCat("bearer ", kTrain);
  EXPECT_TRUE(authorizer_->Authenticate(Metadata{{"authorization", lower}}).ok());
}

TEST_F(AuthorizerTest, AJobTokenMayUseItsJobsOnlyAndTheDenialNamesTheJobNotTheToken) {
  auto train = With(kTrain);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_TRUE(train->MayUseJob("train").ok());
  absl::Status other = train->MayUseJob("secret-run");
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(other.message()),
              AllOf(HasSubstr("job = \"secret-run\""), HasSubstr("it grants train"),
                    Not(HasSubstr(kTrain))));
  absl::Status list = train->MayCallServerWide("ListJobs");
  EXPECT_EQ(list.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(list.message()), HasSubstr("ListJobs needs an admin token"));

  auto admin = With(kAdmin);
  ASSERT_TRUE(admin.ok());
  EXPECT_TRUE(admin->MayUseJob("secret-run").ok());
  EXPECT_TRUE(admin->MayCallServerWide("ListJobs").ok());
  EXPECT_TRUE(Caller::Unrestricted().MayUseJob("x").ok());
  EXPECT_TRUE(Caller::Unrestricted().MayCallServerWide("DeleteJob").ok());
}

// Every RPC of the .proto has a rule (MethodAccess::Of CHECK-fails otherwise), and the rule is
// the one docs/SECURITY.md states.
TEST_F(AuthorizerTest, EveryMethodIsAdminOnlyOrScopedToTheJobItsRequestNames) {
  const google::protobuf::ServiceDescriptor* service =
      v1::Job::descriptor()->file()->FindServiceByName("Sampler");
  ASSERT_NE(service, nullptr);
  auto train = With(kTrain);
  ASSERT_TRUE(train.ok());
  for (int i = 0; i < service->method_count(); ++i) {
    const google::protobuf::MethodDescriptor& method = *service->method(i);
    const MethodAccess access = MethodAccess::Of(method);
    const bool admin_only = method.name() == "ListJobs" || method.name() == "DeleteJob";
    std::unique_ptr<google::protobuf::Message> request(
        google::protobuf::MessageFactory::generated_factory()
            ->GetPrototype(method.input_type())
            ->New());
    const google::protobuf::FieldDescriptor* field = method.input_type()->FindFieldByName("job");
    if (field == nullptr) field = method.input_type()->FindFieldByName("name");
    ASSERT_TRUE(admin_only || field != nullptr) << method.name();
    if (field != nullptr) request->GetReflection()->SetString(request.get(), field, "train");
    EXPECT_EQ(access.Check(*train, *request).ok(), !admin_only) << method.name();
    if (field != nullptr) request->GetReflection()->SetString(request.get(), field, "eval");
    absl::Status denied = access.Check(*train, *request);
    EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied) << method.name();
    EXPECT_THAT(std::string(denied.message()),
                HasSubstr(admin_only ? method.name() : "job = \"eval\""));
    EXPECT_TRUE(access.Check(*With(kAdmin), *request).ok()) << method.name();
  }
}

TEST_F(AuthorizerTest, ReloadAddsAndRevokesTokensAndABadFileKeepsTheTableInUse) {
  EXPECT_FALSE(With(kEval).ok());
  // A caller made before the reload keeps its grant; the next authentication sees the new file.
  auto before = With(kTrain);
  ASSERT_TRUE(before.ok());
  testutil::WriteBytes(path_, absl::StrCat(kAdmin, " admin\n", kEval, " jobs=eval\n"));
  ASSERT_TRUE(authorizer_->Reload().ok());
  EXPECT_TRUE(With(kEval).ok());
  EXPECT_EQ(With(kTrain).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(before->MayUseJob("train").ok());

  testutil::WriteBytes(path_, absl::StrCat(kAdmin, " admin\n", kTrain, " jobs=a b\n"));
  absl::Status bad = authorizer_->Reload();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()),
              AllOf(HasSubstr(absl::StrCat("auth_tokens_file = \"", path_, "\"")),
                    HasSubstr("line 2"), Not(HasSubstr(kTrain))));
  EXPECT_TRUE(With(kEval).ok());  // The table of the last good file.
  EXPECT_EQ(With(kTrain).status().code(), absl::StatusCode::kUnauthenticated);

  testutil::WriteBytes(path_, "# everyone revoked\n");
  EXPECT_THAT(std::string(authorizer_->Reload().message()), HasSubstr("holds no token"));
  EXPECT_TRUE(With(kEval).ok());
  EXPECT_EQ(authorizer_->size(), 2u);
}

// As ssh refuses a writable authorized_keys: whoever may write the file may grant themselves
// admin. At start and on reload (where the table in use stays).
TEST_F(AuthorizerTest, AFileOthersMayWriteIsRefused) {
  for (const auto& [mode, who] : {std::pair<mode_t, std::string>{0620, "its group (mode 0620)"},
                                  {0602, "every user (mode 0602)"},
                                  {0666, "every user (mode 0666)"}}) {
    ASSERT_EQ(::chmod(path_.c_str(), mode), 0);
    auto created = Authorizer::Create(path_);
    EXPECT_EQ(created.status().code(), absl::StatusCode::kPermissionDenied) << who;
    EXPECT_THAT(
        std::string(created.status().message()),
        AllOf(HasSubstr(absl::StrCat("auth_tokens_file = \"", path_, "\": writable by ", who)),
              HasSubstr("chmod go-w")));
    EXPECT_EQ(authorizer_->Reload().code(), absl::StatusCode::kPermissionDenied) << who;
    EXPECT_TRUE(With(kTrain).ok());
  }
  ASSERT_EQ(::chmod(path_.c_str(), 0640), 0);
  EXPECT_TRUE(Authorizer::Create(path_).ok());
}

TEST(AuthorizerCreateTest, ABadFileIsAnErrorNamingTheFlagThePathAndTheLine) {
  testutil::TestDir dir;
  EXPECT_THAT(std::string(Authorizer::Create(dir.path() + "/none").status().message()),
              HasSubstr(absl::StrCat("auth_tokens_file = \"", dir.path(), "/none\"")));
  testutil::WriteBytes(dir.path() + "/tokens", absl::StrCat("\n\n", kTrain, " jobs=\n"));
  auto bad = Authorizer::Create(dir.path() + "/tokens");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("line 3"));
  testutil::WriteBytes(dir.path() + "/tokens", "");
  EXPECT_THAT(std::string(Authorizer::Create(dir.path() + "/tokens").status().message()),
              HasSubstr("holds no token"));
}

}  // namespace
}  // namespace samplerd
