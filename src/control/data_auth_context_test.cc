// The data plane's authentication context (control/auth.h): one per engine
// rank, never the control plane's, so a handshake of one kind of link (or
// for one engine rank) is never valid for another. The handshake itself is
// tested in auth_test.cc; data links end to end in tests/fault_test.cc
// (DataPlaneAuth.*).
#include <gtest/gtest.h>

#include "control/auth.h"

namespace refit {
namespace {

// Catches: a data context that ignores the engine rank, or equals the
// control plane's (a control handshake would then pass on a data link).
TEST(DataAuthContext, NamesTheEngineRankAndDiffersFromTheControlContext) {
  EXPECT_EQ(data_auth_context(3), "refit data v1 -> engine rank 3");
  EXPECT_NE(data_auth_context(0), data_auth_context(1));
  EXPECT_NE(data_auth_context(0), std::string(kControlAuthContext));
  const Secret secret("0123456789abcdef-the-shared-secret");
  AuthNonce server{}, client{};
  server.fill(1);
  client.fill(2);
  const AuthMac control = auth_mac(secret, AuthDirection::kClientProof, kControlAuthContext, server, client);
  const AuthMac rank0 = auth_mac(secret, AuthDirection::kClientProof, data_auth_context(0), server, client);
  const AuthMac rank1 = auth_mac(secret, AuthDirection::kClientProof, data_auth_context(1), server, client);
  EXPECT_NE(rank0, control);
  EXPECT_NE(rank0, rank1);
}

}  // namespace
}  // namespace refit
