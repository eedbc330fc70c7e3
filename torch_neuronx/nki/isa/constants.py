"""``nki.isa.constants``: the instruction enums (also on ``nki.isa``)."""
from . import dge_mode, engine, nc_version, oob_mode, reduce_cmd  # noqa: F401
