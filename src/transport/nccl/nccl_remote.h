// The nccl transport's remote side: what a trainer rank holds to write into
// one engine rank's nccl target (nccl_target.h): its side of their 2-rank
// communicator, a payload-less kData frame announcing each write, then the
// ncclSend. Private to src/transport/nccl; built only with NCCL.
#pragma once

#if REFIT_HAVE_NCCL

#include <memory>
#include <string>

#include "net/link.h"
#include "refit/status.h"
#include "transport/nccl/nccl_descriptor.h"
#include "transport/transport.h"

namespace refit::nccl_internal {

// The remote of the target `d` describes, fed over `link` from CUDA device
// `device` (checked by the caller); starts this side of the communicator.
// `what` names the remote in errors.
StatusOr<std::unique_ptr<RemoteTarget>> open_nccl_remote(const NcclDescriptor& d, Link* link, int device,
                                                         const std::string& what);

}  // namespace refit::nccl_internal

#endif  // REFIT_HAVE_NCCL
