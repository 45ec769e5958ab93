// What a role did over a job, for the one line it logs when the job ends
// well (issue 17: "a one-line summary from each role on success"):
//   engine rank 0: 3 refits (versions 1..3) committed and verified, 53.77 MiB
//   received each (161.3 MiB in all), 0.41 s from setup to the last commit
// The ranks (runtime/) and the coordinator (control/) keep one each, so it
// lives in core/ and needs only public headers.
//
// Thread safety: none; its owner's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "refit/format.h"
#include "refit/plan.h"
#include "refit/tensor.h"

namespace refit {

// The bytes of one refit of `stream`.
inline std::uint64_t stream_bytes(const std::vector<TensorSpec>& stream) {
  std::uint64_t bytes = 0;
  for (const TensorSpec& s : stream) bytes += s.nbytes();
  return bytes;
}

class RefitTally {
 public:
  // One committed refit of `bytes` (this rank's share).
  void add(std::uint64_t version, std::uint64_t bytes) {
    if (count_ == 0) first_ = version;
    last_ = version;
    ++count_;
    bytes_ += bytes;
    same_ = count_ == 1 || (same_ && bytes == each_);
    each_ = bytes;
    last_commit_ = std::chrono::steady_clock::now();
  }

  // "3 refits (versions 1..3) <outcome>, 53.77 MiB <verb> each (161.3 MiB in
  // all), 0.41 s from setup to the last commit"; "no refit <outcome>" without
  // one; refits of different sizes (partial refits): "161.3 MiB <verb> in all".
  std::string summary(const std::string& verb, const std::string& outcome) const {
    if (count_ == 0) return "no refit " + outcome;
    const std::string versions = first_ == last_ ? "version " + std::to_string(first_)
                                                 : "versions " + std::to_string(first_) + ".." + std::to_string(last_);
    const double seconds = std::chrono::duration<double>(last_commit_ - started_).count();
    const std::string moved = same_ ? format_bytes(each_) + " " + verb + " each (" + format_bytes(bytes_) + " in all)"
                                    : format_bytes(bytes_) + " " + verb + " in all";
    return format_count(count_, "refit") + " (" + versions + ") " + outcome + ", " + moved + ", " +
           format_seconds(seconds) + " from setup to the last commit";
  }

 private:
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now(), last_commit_ = started_;
  std::uint64_t count_ = 0, first_ = 0, last_ = 0, bytes_ = 0, each_ = 0;
  bool same_ = true;  // every refit moved each_ bytes
};

}  // namespace refit
