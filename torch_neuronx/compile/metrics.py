"""Counters of the compile tier, reported by ``torch_neuronx.metrics()["compile"]``."""
import collections
import threading

_lock = threading.Lock()


def _fresh():
    return {"compiles": 0, "cache_hits": 0, "graph_cache_hits": 0, "graph_cache_skips": 0, "kernels_built": 0, "kernel_cache_hits": 0, "kernel_cache_corrupt": 0,
            "recompiles": 0, "recompile_reasons": [], "compile_seconds": 0.0, "fused_groups": 0, "fused_nodes": 0,
            "fused_row_groups": 0, "gemms": 0, "convolutions": 0, "epilogues": 0,
            "library_calls": collections.Counter(), "out_calls": 0, "views_simplified": 0, "constants_folded": 0, "arena_bytes": 0, "planned_bytes": 0,
            "planned_values": 0, "eager_graphs": 0, "eager_reasons": []}


_m = _fresh()


def record(stats):
    with _lock:
        _m["compiles"] += 1
        _m["compile_seconds"] += stats["seconds"]
        _m["kernels_built"] += stats["kernels_built"]
        _m["kernel_cache_hits"] += stats["kernel_cache_hits"]
        _m["kernel_cache_corrupt"] += stats["kernel_cache_corrupt"]
        if stats["kernel_units"] and stats["kernels_built"] == 0:
            _m["cache_hits"] += 1
        _m["fused_groups"] += stats["groups"]
        _m["fused_nodes"] += stats["fused_nodes"]
        _m["fused_row_groups"] += stats["row_groups"]
        _m["gemms"] += stats["gemms"]
        _m["convolutions"] += stats["convolutions"]
        _m["epilogues"] += stats["epilogues"]
        _m["library_calls"].update(stats["library_ops"])
        _m["out_calls"] += stats["out_calls"]
        _m["views_simplified"] += stats["views_simplified"]
        _m["constants_folded"] += stats["constants_folded"]
        _m["arena_bytes"] += stats["arena_bytes"]
        _m["planned_bytes"] += stats["planned_bytes"]
        _m["planned_values"] += stats["planned_values"]


def record_graph_cache_hit():
    with _lock:
        _m["graph_cache_hits"] += 1


def record_graph_cache_skip():
    with _lock:
        _m["graph_cache_skips"] += 1


def record_frontend_seconds(seconds):
    with _lock:
        _m["compile_seconds"] += seconds


def record_recompile(reasons):
    with _lock:
        _m["recompiles"] += 1
        _m["recompile_reasons"].extend(reasons)


def record_eager(reason):
    with _lock:
        _m["eager_graphs"] += 1
        _m["eager_reasons"].append(reason)


def compile_metrics():
    """A snapshot of the counters: compiles, executable cache hits (every kernel loaded from the
    disk cache), graph cache hits (a graph loaded from AOTAutograd's cache in a new process,
    without tracing or exporting it again; graph_cache_skips: graphs with aliased outputs, which
    are not cached), kernels built, recompiles with Dynamo's reasons, compile seconds (AOT + compiler),
    fused groups/nodes (row groups: a softmax, log_softmax or layer norm fused with the pointwise
    ops around it), GEMMs run as oneDNN matmuls, convolutions run with a fused
    epilogue, and the pointwise epilogues fused into both (activation, residual add), library
    calls by op (ops without a lowering, run as ATen kernels inside the
    executable) and how many of them write through out= into memory the executable chooses, views
    simplified and nodes folded to constants, the
    memory plan (arena bytes per launch, planned intermediates and their bytes before reuse), and
    graphs that ran eagerly with the reason."""
    with _lock:
        out = dict(_m)
        out["library_calls"] = dict(_m["library_calls"])
        out["recompile_reasons"] = list(_m["recompile_reasons"])
        out["eager_reasons"] = list(_m["eager_reasons"])
        return out


def reset_compile_metrics():
    """Zero the compile counters."""
    global _m
    with _lock:
        _m = _fresh()
