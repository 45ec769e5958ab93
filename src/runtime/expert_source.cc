#include "runtime/expert_source.h"

#include <utility>

#include "refit/expert_parallel.h"

namespace refit {
namespace {

class ExpertRuleSource final : public WeightSource {
 public:
  ExpertRuleSource(std::unique_ptr<WeightSource> inner, Model model)
      : inner_(std::move(inner)), model_(std::move(model)) {}

  const Model& model() const override { return model_; }
  MemoryKind memory() const override { return inner_->memory(); }
  int device() const override { return inner_->device(); }
  Status prepare(std::uint64_t version, std::uint64_t seed) override { return inner_->prepare(version, seed); }
  Status derive(std::uint64_t version) override { return inner_->derive(version); }
  const std::byte* data(std::size_t i) const override { return inner_->data(i); }
  std::vector<std::pair<const std::byte*, std::uint64_t>> stable_host_ranges() const override {
    return inner_->stable_host_ranges();
  }
  Status check_unchanged() const override { return inner_->check_unchanged(); }
  std::vector<Layout> trainer_layouts() const override { return inner_->trainer_layouts(); }

 private:
  std::unique_ptr<WeightSource> inner_;
  Model model_;
};

}  // namespace

StatusOr<std::unique_ptr<WeightSource>> with_engine_experts(std::unique_ptr<WeightSource> source,
                                                            const RankOptions& options) {
  ASSIGN_OR_RETURN(const EngineExperts experts, parse_engine_experts(options.engine_experts));
  // A Megatron-named source's plan applies the rules to the engine's own tensors (runtime/sharded_plan.h).
  if (experts == EngineExperts::kTp || options.trainer_names != "hf") return source;
  ASSIGN_OR_RETURN(Model model, engine_expert_model(source->model(), experts, options.engine_ranks));
  return std::unique_ptr<WeightSource>(new ExpertRuleSource(std::move(source), std::move(model)));
}

}  // namespace refit
