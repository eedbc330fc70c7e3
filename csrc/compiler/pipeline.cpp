#include "compiler/pipeline.h"

#include <chrono>
#include <fstream>
#include <sys/stat.h>

#include "compiler/epilogue_fusion.h"
#include "compiler/flex_attention.h"

namespace neuronx::compiler {

namespace {

void dump(const std::string& dir, const std::string& name, const std::string& text) {
  if (dir.empty()) return;
  ::mkdir(dir.c_str(), 0700);
  std::ofstream(dir + "/" + name) << text;
}

}  // namespace

std::shared_ptr<Executable> compile(Graph g, const std::string& debug_dir, CompileStats& stats) {
  const auto t0 = std::chrono::steady_clock::now();
  KernelCache& cache = KernelCache::instance();
  const std::string before = g.dump();
  stats.ir_hash = cache.hash(before);
  const std::string tag = stats.ir_hash.substr(0, 12);
  dump(debug_dir, tag + ".ir_before.txt", before);
  // Epilogues first, on exact reader counts (after dead code is gone); the weight views it
  // adds compose with the graph's own in simplify_views.
  stats.passes.dead_removed = eliminate_dead_code(g);
  const EpilogueStats epi = fuse_epilogues(g);
  stats.passes.gemms = epi.gemms;
  stats.passes.convolutions = epi.convolutions;
  stats.passes.epilogues = epi.epilogues;
  stats.passes.views_simplified = simplify_views(g);
  stats.passes.common_removed = eliminate_common_subexpressions(g);
  stats.passes.dead_removed += eliminate_dead_code(g);
  auto groups = fuse_pointwise(g);
  stats.passes.fused_groups = static_cast<int>(groups.size());
  for (const auto& grp : groups) {
    stats.passes.fused_nodes += static_cast<int>(grp.nodes.size());
    stats.passes.fused_row_groups += grp.reduction >= 0;
  }
  dump(debug_dir, tag + ".ir_after.txt", g.dump());
  // One translation unit per group: they build in parallel and are cached one by one.
  std::vector<std::string> sources;
  std::vector<std::vector<std::string>> names;
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string fn = "nx_fused";
    sources.push_back(kernel_prelude() + generate_kernel(g, groups[i], fn));
    names.push_back({fn});
    dump(debug_dir, tag + ".kernel" + std::to_string(i) + ".cpp", sources.back());
  }
  std::vector<std::shared_ptr<SharedObject>> libs;
  auto fns = cache.load(sources, names, libs, stats.build);
  std::vector<KernelFn> kernels;
  for (auto& f : fns) kernels.push_back(f.at(0));
  // FlexAttention's kernels, built now (not when the program first runs); the op finds them by
  // its program argument.
  for (const Node& n : g.nodes) {
    if (n.kind != Node::Kind::kAten || !op_info(n.id).flex_attention) continue;
    const Arg& program = n.args.back();
    TORCH_CHECK(program.kind == Arg::Kind::kConstant && program.constant.isString(),
                "torch_neuronx compiler: ", n.target, " without a constant program");
    flex_kernels(program.constant.toStringRef(), &stats.build);
    stats.passes.flex_attention++;
  }
  auto exe = std::make_shared<Executable>(std::move(g), std::move(groups), std::move(kernels), std::move(libs));
  stats.out_calls = exe->out_calls();
  stats.output_copies = exe->output_copies();
  stats.passes.constants_folded = exe->folded();
  for (size_t i = 0; i < exe->graph().nodes.size(); ++i) {
    const Node& n = exe->graph().nodes[i];
    if (n.kind == Node::Kind::kAten && n.fused_group < 0 && !exe->is_folded(static_cast<int>(i))) {
      stats.library_calls[n.target]++;
    }
  }
  stats.arena_bytes = exe->memory_plan().arena_bytes;
  stats.planned_bytes = exe->memory_plan().planned_bytes;
  stats.planned_values = exe->memory_plan().planned_values;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return exe;
}

std::vector<std::string> compile_counter_names() {
  std::vector<std::string> names;
#define NEURONX_NAME(f) names.emplace_back(#f);
  NEURONX_PASS_STATS(NEURONX_NAME)
  NEURONX_BUILD_STATS(NEURONX_NAME)
  NEURONX_PLAN_STATS(NEURONX_NAME)
#undef NEURONX_NAME
  return names;
}

}  // namespace neuronx::compiler
