"""A sweep worker process (the conformance worker protocol): a unit is one architecture of one
table; its cases are the table's checks."""
from ..conformance.worker import serve
from .checks import Arch


class Registry:
    def cases(self, unit):
        table, _, model_type = unit["name"].partition("/")
        arch = Arch(table, model_type, compiled=unit["dtype"] == "compile")
        for check, thunk in arch.cases():
            yield f"{unit['name']}|{unit['dtype']}|{check}", check, thunk


if __name__ == "__main__":
    import transformers  # noqa: F401  (import once per worker, not per unit)
    transformers.logging.set_verbosity_error()
    serve(Registry)
