"""Counters of the compile tier, reported by ``torch_neuronx.metrics()["compile"]``."""
import collections
import threading

from .. import _C

_lock = threading.Lock()


def _fresh():
    m = {"compiles": 0, "cache_hits": 0, "graph_cache_hits": 0, "graph_cache_skips": 0, "recompiles": 0,
         "recompile_reasons": [], "compile_seconds": 0.0, "library_calls": collections.Counter(),
         "eager_graphs": 0, "eager_reasons": [], "channels_last_convolutions": 0, "channels_last_saved": 0,
         "channels_last_received": 0, "relu_pool_swaps": 0}
    # The compiler's counters, under the names it exports them by (listed once, in C++).
    m.update({name: 0 for name in _C._compiler._compile_counters()})
    return m


_m = _fresh()


def record(stats):
    counters = stats["counters"]
    with _lock:
        _m["compiles"] += 1
        _m["compile_seconds"] += stats["seconds"]
        for name, n in counters.items():
            _m[name] += n
        if counters["kernel_units"] and counters["kernels_built"] == 0:
            _m["cache_hits"] += 1
        _m["library_calls"].update(stats["library_calls"])


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


def record_layout(convolutions, sent, received):
    with _lock:
        _m["channels_last_convolutions"] += convolutions
        _m["channels_last_saved"] += sent
        _m["channels_last_received"] += received


def record_relu_pool_swaps(n):
    with _lock:
        _m["relu_pool_swaps"] += n


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
    simplified, common subexpressions and dead nodes removed, nodes folded to constants, the
    memory plan (arena bytes per launch, planned intermediates and their bytes before reuse),
    convolutions given channels-last inputs by the layout pass, the activations forwards saved
    channels-last for their backwards and those the backwards received so, and graphs that ran
    eagerly with the reason."""
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
