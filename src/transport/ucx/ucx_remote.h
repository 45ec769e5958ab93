// The ucx transport's remote side: what a trainer holds to write into one
// engine's registered memory (ucx_target.h) over a UCP endpoint. Private to
// src/transport/ucx; built only with UCX (REFIT_HAVE_UCX).
#pragma once

#if REFIT_HAVE_UCX

#include <memory>
#include <string>

#include "refit/status.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_descriptor.h"
#include "transport/ucx/ucx_transport.h"
#include "transport/ucx/ucx_worker.h"

namespace refit {

// Connects an endpoint of `w` to the worker that descriptor `d` names and
// returns the remote over it. The endpoint is wired up now (a flush waits
// for it, up to options.connect_timeout), so an engine that cannot be
// reached fails setup rather than the first refit. `peer` names the engine
// in errors. Writes go by put where options.writes says so (kAuto: where UCX
// reaches the peer with native remote memory access), else by message.
StatusOr<std::unique_ptr<RemoteTarget>> open_ucx_remote(std::shared_ptr<UcxWorker> w, const UcxDescriptor& d,
                                                        const std::string& peer, const UcxOptions& options);

}  // namespace refit

#endif  // REFIT_HAVE_UCX
