#include "chat/jinja/ast.h"
#include "chat/jinja/interp.h"
#include "chat/jinja/jinja.h"
#include "chat/jinja/parser.h"

namespace pg::jinja {

struct Template::Impl {
  Body body;
};

Template::Template(std::string_view source) {
  auto impl = std::make_shared<Impl>();
  impl->body = parse_template(source);
  impl_ = std::move(impl);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& vars, const RenderOptions& opts) const {
  if (!vars.is_null() && !vars.is_object()) throw pg::Error("template variables must be a JSON object");
  Interp in(opts);
  std::vector<std::pair<std::string, Value>> values;
  if (vars.is_object()) {
    for (auto it = vars.begin(); it != vars.end(); ++it) values.emplace_back(it.key(), from_json(in, it.value()));
  }
  return in.render(impl_->body, values);
}

}  // namespace pg::jinja
