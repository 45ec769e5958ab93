// The three roles of a refit job, each runnable as its own process
// (`refit coordinator|trainer|engine`) or launched together by `refit demo`.
//
// A trainer rank (trainer_rank.h) holds the full weights of a model (a
// WeightSource: synthetic, external or a checkpoint) and sends, for the
// engine rank it feeds (rank % engine_ranks), that rank's shard of every
// tensor, bucket by bucket. An engine rank owns a receiver, aligns its stream against its
// peers' plans and applies the aligned batches to an embedded
// ReferenceEngine, then verifies every byte before it reports success.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "refit/fault_hook.h"
#include "refit/status.h"
#include "refit/transfer_defaults.h"

namespace refit {

struct RankOptions {
  // host:port of the coordinator. Default: "" (required).
  std::string coordinator;
  // The job's secret (CLI: --secret-file, REFIT_SECRET); "": none. It
  // authenticates the control plane (rank <-> coordinator) and the data
  // plane (trainer rank -> engine rank), each with its own context (auth.h).
  // Default: "" (no authentication; loopback only).
  std::string secret;
  // This process's rank within its role. Default: 0.
  int rank = 0;
  // Trainer ranks of the job. Default: 1.
  int trainer_ranks = 1;
  // Engine ranks of the job (the engine's TP size). Default: 1.
  int engine_ranks = 1;
  // A preset of model.h, or a safetensors checkpoint path (checkpoint.h).
  // Default: "tiny".
  std::string model = "tiny";
  // Checkpoints: "GLOB=RULE" rows ahead of default_shard_rules().
  // Default: none.
  std::vector<std::string> shard_rules;
  // Keep the first N decoder layers; -1: all. Default: -1.
  int layers = -1;
  // Trainer: how the trainer ranks hold the weights (trainer_layout.h:
  // "full", "fsdp", "tp", "tp:X,fsdp:Y"). A sharded layout makes the
  // synthetic source hold only this rank's shards and feeds every engine
  // rank they reach (check_sharded_settings: every transport but nccl,
  // staged or direct; host weights into device engines over cuda_ipc).
  // Default: "full".
  std::string trainer_layout = "full";
  // Trainer: how it names the weights (reshard/megatron_model.h): "hf" (as
  // the engine does) or "megatron" (Megatron-Core's fused linear_qkv and
  // linear_fc1 and stacked experts, of a Llama- or Qwen3-MoE-like preset,
  // with a --trainer-layout of fsdp; the transfer plan moves each sub-slice
  // straight into the engine's Hugging Face tensors). Default: "hf".
  std::string trainer_names = "hf";
  // How the engine splits expert tensors (expert_parallel.h): "tp" (by
  // their TP rules) or "ep" (whole experts per engine rank). Trainers and
  // engines of a job must agree (their streams are compared at setup).
  // Default: "tp".
  std::string engine_experts = "tp";
  // The conversions the engine declares (refit/quantize.h): "none",
  // "fp8-block128" (bf16 or fp32 linear weights held as FP8 codes with
  // 128 x 128 block scales) or "fp8-block128:GLOB,...". The trainer
  // quantizes on its own side (its GPU, or the CPU reference), so the link
  // carries the FP8 bytes; the engine verifies codes and scales against the
  // same function. Trainers and engines of a job must agree (their streams
  // are compared at setup, naming the first tensor that differs). Default:
  // "none".
  std::string quantize = "none";
  // Bytes per transport bucket; every rank of a job must agree (checked at
  // setup). Larger buckets amortise per-bucket costs on GPUs (docs/PERF.md),
  // smaller ones keep staging memory small. Default: kAutoBucketSize, which
  // stands for 1 GiB over cuda_ipc and nccl and 64 MiB over shm, tcp and ucx
  // (transfer_defaults.h; the CLI, the Python package and the
  // library all take this one value).
  std::uint64_t bucket_size = kAutoBucketSize;
  // One of transport_names(). Default: "shm".
  std::string transport = "shm";
  // Where weights and staging live: "cpu" or "cuda". Default: "cpu".
  std::string device = "cpu";
  // "staged" (receive pool) or "direct" (into the engine's weights).
  // Default: "staged".
  std::string mode = "staged";
  // Synthetic weights (a preset model): the fraction of each tensor's
  // elements that changes from one version to the next, like an optimizer
  // step (refit/content.h ContentKey); 1: every element. Every rank of a job
  // must agree (the coordinator refuses one that differs). Default: 1.
  double change_fraction = 1;
  // Delta refits (issue 22): each bucket goes as the smaller of its bytes
  // and a bitmap of its changed 8-byte words with their new bytes, against
  // the version the engine rank holds committed (delta/word_delta.h); an
  // engine rank without it (a new, restarted or failed one) gets the bytes.
  // The trainer keeps what it sent of each bucket (up to twice its share
  // of the stream). Staged; host weights over shm, tcp or ucx, device
  // weights over cuda_ipc, ucx or nccl; full-weight trainers (refused
  // otherwise). Under --quantize the FP8 codes and scales are encoded; a
  // partial refit goes as its bytes. Trainers and engines of a job must
  // agree. Default: false.
  bool delta = false;
  // Seconds for joining, validation and linking. Default: 60.
  double setup_timeout_s = 60;
  // Seconds for one whole refit; suits multi-GB refits. Default: 300.
  double refit_timeout_s = 300;
  // The longest wait for the next bucket's credit (trainer) or the next
  // aligned batch (engine): a stalled or dead peer fails the refit after this
  // long, naming the peer and the bucket, however long the refit may take.
  // Default: 60 seconds.
  double bucket_timeout_s = 60;
  // Liveness (docs/RELIABILITY.md): this rank sends the coordinator a
  // heartbeat each this many seconds, from its setup until the job ends,
  // whatever it is doing. Must be below the coordinator's heartbeat
  // timeout. Default: 1.
  double heartbeat_interval_s = 1;
  // A coordinator this rank heard nothing from for this many seconds is
  // lost (stalled, dead or cut off): every wait of the rank ends with that
  // error, between refits too (a wait for the next refit has no other
  // deadline: a trainer step may take hours). Default: 10.
  double heartbeat_timeout_s = 10;
  // Fault injection for tests (trainer only): pack the shards of this engine
  // rank instead of the fed rank's, as a transposed payload list would.
  // Default: -1 (off).
  int debug_pack_rank = -1;
  // Fault injection for tests (trainer only): fail refit N after its first
  // bucket, as a crashing step would, without exiting. Default: 0 (off).
  std::uint64_t debug_fail_refit = 0;
  // Fault injection for tests: in refit N, break this trainer's CUDA context
  // with an illegal-address kernel (device weights only). Default: 0 (off).
  std::uint64_t debug_cuda_fault_refit = 0;
  // Fault injection for tests (trainer only, device weights): in refit N,
  // hold this rank's stream behind a 30 s GPU delay, send its first bucket
  // (over cuda_ipc staged: announced while its pack and landing event still
  // wait behind the delay), then die by SIGKILL, as a trainer killed in the
  // middle of a pack would. Default: 0 (off).
  std::uint64_t debug_die_after_announce = 0;
  // Fault injection for tests (trainer only): in refit N, after sending its
  // first bucket, log one line ("... after sending bucket B of refit N") and
  // stop itself by SIGSTOP, as a trainer stalled mid-refit would; the line
  // tells a test that the refit is under way. Once per process (refit N run
  // again after an engine was dropped goes on). Default: 0 (off).
  std::uint64_t debug_stop_after_bucket = 0;
  // Fault injection for tests (sharded trainer rank): before each of its
  // bucket parts, hold this rank's stream behind a GPU delay of N ms (device
  // weights), so that its writes land well after another writer's of the
  // same slot; and sleep M ms on the host, so that its calls (a landing
  // event's record) come after another writer's. Default: 0 (off).
  std::uint32_t debug_gpu_delay_ms = 0;
  std::uint32_t debug_host_delay_ms = 0;
  // Fault injection for tests: kill or stop this rank at one step of the
  // control protocol in one refit (refit/fault_hook.h; `--debug-fault
  // commit:2:kill`). Default: off (version 0).
  FaultHook debug_fault;
  // Fault injection for tests (trainer only): authenticate the data link
  // with this secret instead of `secret`, as a trainer configured with
  // another job's secret would. Default: "" (off).
  std::string debug_data_secret;
  // Trainer: local CUDA device index (inside CUDA_VISIBLE_DEVICES) of its
  // weights, or of the copies into a device engine when its weights are on
  // the host. Default: 0.
  int gpu = 0;
  // Trainer, host weights with stable ranges (a mapped checkpoint) feeding
  // device engines: register them with the device once (cudaHostRegister of
  // the read-only shared file mappings) and let the copy engines read them
  // straight into the engine's slots or weights, with no host copy (0.98x
  // of the pinned host-to-device ceiling on the H200 against 0.6x through
  // pinned buffers; docs/PERF.md). Where the driver refuses, the rank says
  // so and packs through pinned buffers. false: always pinned buffers.
  // Default: true.
  bool register_host_weights = true;
};

struct EngineOptions : RankOptions {
  // The engine this rank belongs to (many engines, CoordinatorOptions::
  // engines): engine 0 is fed by the trainer ranks, every other by its
  // parent in the relay tree; every engine has the same ranks. Default: 0.
  int engine = 0;
  // Staging slots of the receive pool (staged mode), each as large as the
  // plan's largest bucket. Default: kAutoPoolSlots, which stands for 3, or
  // 2 where memory_limit holds fewer than 3 (transfer_defaults.h).
  int pool_slots = kAutoPoolSlots;
  // Bytes for the receive pool and, with `shadow`, the second weight arena
  // (taken first; the pool gets the rest); 0: no limit. Default: 0.
  std::uint64_t memory_limit = 0;
  // Shadow weights (issue 21; ReferenceEngineOptions::shadow): the weights
  // are two arenas; a refit lands in the one not served, is verified there,
  // and the commit flips it into service. Twice the weight memory. Staged
  // mode only (direct mode: refused, not built yet). Default: false.
  bool shadow = false;
  // Reader threads standing in for a server's forward passes during refits
  // (runtime/weight_readers.h): each checks one served tensor per pass
  // against the committed version's synthetic content; the report counts
  // `reads` and `torn_reads`. Synthetic models without --quantize only.
  // Default: 0.
  int readers = 0;
  // Where trainers connect for data. Default: "127.0.0.1".
  std::string listen_host = "127.0.0.1";
  // Debug: poison every recycled staging buffer. Default: false.
  bool poison_recycled = false;
  // Verify every byte after each refit: presets against the synthetic
  // content, checkpoints against the file's bytes. Default: true.
  bool verify = true;
  // After each committed refit, write this rank's weights (its shards) to
  // this safetensors file (`refit save`); empty: never. Default: "".
  std::string save_path;
  // Dtypes this engine supports (dtype names); empty: every dtype.
  // Default: empty.
  std::vector<std::string> supported_dtypes;
  // DESIGN.md rule 7: engine rank r uses local device base_gpu_id + r, an
  // index inside CUDA_VISIBLE_DEVICES, never a physical id. Default: 0.
  int base_gpu_id = 0;
  // GPUs the engine's ranks share round-robin (base_gpu_id + r % engine_gpus;
  // device_memory.h engine_local_device); 0: one per rank. Default: 0.
  int engine_gpus = 0;
};

// Checks the settings of one rank that need no peer: device, mode and
// transport fit together, and --device cuda has a usable CUDA device ("no
// CUDA device (...)" otherwise). Errors name the setting.
Status validate_rank_settings(const RankOptions& options, bool engine);

// Tells the coordinator at options.coordinator that this rank (rank
// options.rank: an engine rank of engine `engine_index` when `engine`, else
// a trainer rank) failed
// its setup before it joined, and why (`error`), so that the coordinator
// and every other rank stop at once naming it instead of waiting out the
// setup deadline. Call it in place of joining: after validate_rank_settings
// or opening the model failed, or a command line was refused; a rank that
// has joined reports through its control link instead. Best effort: it
// blocks at most min(options.setup_timeout_s, 3 s), and does nothing
// without a coordinator address or when `error` is OK.
void report_rank_setup_failure(const RankOptions& options, bool engine, const Status& error, int engine_index = 0);

Status run_trainer(const RankOptions& options);
Status run_engine(const EngineOptions& options);

}  // namespace refit
