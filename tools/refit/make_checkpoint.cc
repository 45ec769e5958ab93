// `refit make-checkpoint`: writes a preset's synthetic weights (content.h, the
// content of version 1 under --seed) as a sharded safetensors checkpoint:
// `files` files plus model.safetensors.index.json, the way Hugging Face
// stores large models. For benchmarks and tests of `refit push` (hidden).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "flags.h"
#include "refit/checkpoint.h"
#include "refit/content.h"
#include "refit/model.h"
#include "refit/safetensors.h"

namespace refit::cli {
namespace {

using Json = nlohmann::json;

struct MakeCheckpointOptions {
  std::string model = "tiny";  // a preset
  int layers = -1;
  std::uint64_t seed = 0;
  int files = 2;
  std::string out;  // a directory (created)
};

Status make_checkpoint(const MakeCheckpointOptions& options) {
  if (options.files < 1) return InvalidArgument("--files must be at least 1");
  ASSIGN_OR_RETURN(Model model, make_model(options.model, options.layers));
  std::error_code ec;
  std::filesystem::create_directories(options.out, ec);
  if (ec) return InvalidArgument("cannot create " + options.out + ": " + ec.message());
  // Consecutive tensors, about total / files bytes per file.
  const std::uint64_t target = model.total_bytes() / static_cast<std::uint64_t>(options.files) + 1;
  Json weight_map = Json::object();
  std::size_t next = 0;
  for (int f = 0; f < options.files && next < model.weights.size(); ++f) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", f + 1, options.files);
    std::vector<std::vector<std::byte>> bytes;
    std::vector<SafetensorsWriteTensor> tensors;
    std::uint64_t in_file = 0;
    while (next < model.weights.size() && (in_file < target || f == options.files - 1)) {
      const TensorSpec& spec = model.weights[next].spec;
      bytes.emplace_back(spec.nbytes());
      fill_content(content_key(options.seed, 1, spec.name), 0, bytes.back());
      in_file += spec.nbytes();
      weight_map[spec.name] = name;
      ++next;
    }
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      tensors.push_back({model.weights[next - bytes.size() + i].spec, bytes[i]});
    }
    RETURN_IF_ERROR(write_safetensors(options.out + "/" + name, tensors, {{"format", "pt"}}));
  }
  Json index{{"metadata", {{"total_size", model.total_bytes()}}}, {"weight_map", weight_map}};
  std::ofstream(options.out + "/" + std::string(kSafetensorsIndexName)) << index.dump(2) << "\n";
  return Status::Ok();
}

}  // namespace

void add_make_checkpoint_command(CLI::App& app, CommandTable& table) {
  auto o = std::make_shared<MakeCheckpointOptions>();
  CLI::App* cmd = app.add_subcommand("make-checkpoint", "Write a preset's synthetic weights as a sharded checkpoint");
  cmd->group("");  // hidden: the benchmarks' helper
  cmd->add_option("--model", o->model, "Model preset")->check(CLI::IsMember(model_presets()))->capture_default_str();
  cmd->add_option("--layers", o->layers, "Keep the first N decoder layers (-1: all)")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the synthetic weights")->capture_default_str();
  cmd->add_option("--files", o->files, "Number of safetensors files")
      ->check(WholeInt(1, "a count of files", "counts"))
      ->capture_default_str();
  cmd->add_option("--out", o->out, "Output directory")->required();
  table.push_back({cmd, [o] { return make_checkpoint(*o); }});
}

}  // namespace refit::cli
