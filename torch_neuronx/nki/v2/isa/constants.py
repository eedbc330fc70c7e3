"""``nki.isa.constants`` of the Gen-2 API: the instruction enums (also on ``nki.isa``)."""
from . import dge_mode, engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd  # noqa: F401
