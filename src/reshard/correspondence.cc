// Correspondences: see refit/correspondence.h.
#include "refit/correspondence.h"

namespace refit {

std::string box_text(const Box& box) {
  if (box.begin.empty()) return "[]";
  std::string out;
  for (std::size_t d = 0; d < box.begin.size() && d < box.end.size(); ++d) {
    out += (d == 0 ? "[" : " x [") + std::to_string(box.begin[d]) + ", " + std::to_string(box.end[d]) + ")";
  }
  return out;
}

std::string Correspondence::ToString() const {
  return engine_name + " " + box_text(engine_box) + " <- " + trainer_name + " " + box_text(trainer_box);
}

}  // namespace refit
