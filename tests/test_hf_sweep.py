"""The architecture sweep tool (python -m torch_neuronx.hf_sweep): tiny configs, the checks on a
handful of architectures end to end, the report's counting, and that docs/hf_support.md covers
every architecture of the pinned transformers."""
import json
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="make installs the pinned Hugging Face packages")
from torch_neuronx.hf_sweep import report, tiny  # noqa: E402
from torch_neuronx.hf_sweep.checks import TABLES, architectures  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_tiny_configs_keep_each_layer_kind_and_latent_attention_shapes():
    qwen = tiny.config_for("qwen3_next", decoder=True)  # hybrid: linear and full attention layers
    assert qwen.num_hidden_layers == len(qwen.layer_types) <= tiny.MAX_LAYERS
    assert {"linear_attention", "full_attention"} <= set(qwen.layer_types)
    assert qwen.hidden_size == tiny.HIDDEN and qwen.vocab_size == tiny.VOCAB
    ds = tiny.config_for("deepseek_v3")  # latent attention: no grouped KV heads, rotary head_dim
    assert ds.num_key_value_heads == ds.num_attention_heads and ds.head_dim == ds.qk_rope_head_dim
    gpt2 = tiny.config_for("gpt2")
    assert gpt2.n_layer == 2 and gpt2.n_embd == tiny.HIDDEN and gpt2.attn_pdrop == 0.0
    assert all(t < gpt2.vocab_size for t in (gpt2.bos_token_id, gpt2.eos_token_id))  # ids moved into the vocab


def test_per_layer_overrides_follow_the_kept_layers():
    d = {"num_hidden_layers": 6, "hidden_size": 512, "layer_types": ["a", "a", "b", "a", "b", "a"],
         "per_layer_config": {"02": {"x": 1}, "05": {"x": 2}}}
    tiny.shrink_dict(d)
    assert d["layer_types"] == ["a", "b"] and d["num_hidden_layers"] == 2 and d["hidden_size"] == tiny.HIDDEN
    assert d["per_layer_config"] == {"01": {"x": 1}}  # layer 2 of the original is layer 1 now


def _rec(arch, check, outcome, table="causal-lm", mode="eager"):
    return {"table": table, "arch": arch, "cat": check, "outcome": outcome, "id": f"{table}/{arch}|{mode}|{check}",
            "mode": mode, "detail": "why" if outcome != "pass" else None}


def test_report_counts_cpu_failures_apart():
    recs = [_rec("a", "forward", "pass"), _rec("a", "train", "pass"),
            _rec("b", "forward", "pass"), _rec("b", "train", "fail"),
            _rec("c", "forward", "cpu-fail"),
            _rec("d", "forward", "error")]
    t = report.totals(recs)[("causal-lm", "eager")]
    assert (t["pass"], t["fail"], t["cpu-fail"], t["total"]) == (1, 2, 1, 4)
    assert t["rate"] == pytest.approx(1 / 3)
    md = report.markdown(recs, {"transformers": "x", "torch": "y", "jobs": 1, "seconds": 6, "crashes": 0, "date": "d"})
    assert "causal-lm `b` [eager] train: why" in md and "causal-lm `c`: why" in md


def test_report_counts_graphs_run_eagerly_apart_from_passes():
    recs = [_rec("a", "forward", "pass", mode="compile"), _rec("a", "train", "eager", mode="compile"),
            _rec("b", "forward", "pass", mode="compile"), _rec("b", "train", "pass", mode="compile"),
            _rec("c", "forward", "eager", mode="compile"), _rec("c", "train", "fail", mode="compile")]
    t = report.totals(recs)[("causal-lm", "compile")]
    assert (t["pass"], t["eager"], t["fail"], t["total"]) == (1, 1, 1, 3)  # a failure outranks eager
    assert t["rate"] == pytest.approx(1 / 3)
    md = report.markdown(recs, {"transformers": "x", "torch": "y", "jobs": 1, "seconds": 6, "crashes": 0, "date": "d"})
    assert "causal-lm `a` [compile] train: why" in md.split("## Graphs run eagerly")[1]
    assert "| causal-lm | compile | 3 | 1 | 1 | 1 | 0 | 33.3% |" in md


def test_sweep_runs_architectures_on_neuron_against_cpu(tmp_path):
    archs = "llama,gpt2,qwen3_moe,mamba,t5,bert,vit"
    r = subprocess.run([sys.executable, "-m", "torch_neuronx.hf_sweep", "--archs", archs, "--modes", "eager",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["meta"]["crashes"] == 0
    by = {(x["table"], x["arch"], x["cat"]): x["outcome"] for x in res["results"]}
    for table, arch in [("causal-lm", "llama"), ("causal-lm", "gpt2"), ("causal-lm", "qwen3_moe"),
                        ("causal-lm", "mamba"), ("causal-lm", "bert"), ("seq2seq", "t5"), ("masked-lm", "bert"),
                        ("image-classification", "vit")]:
        for check in TABLES[table][1]:
            assert by[(table, arch, check)] == "pass", (table, arch, check, res["results"])
    assert "Failures on `neuron`" in (tmp_path / "report.md").read_text()


def test_compiled_mode_runs_the_neuron_backend_against_cpu_eager(tmp_path):
    r = subprocess.run([sys.executable, "-m", "torch_neuronx.hf_sweep", "--tables", "causal-lm", "--archs",
                        "llama,gpt2", "--modes", "compile", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "results.json").read_text())["results"]
    assert {(x["arch"], x["cat"], x["mode"], x["outcome"]) for x in res} == {
        (a, c, "compile", "pass") for a in ("llama", "gpt2") for c in ("forward", "train", "generate")}


def test_hf_support_doc_covers_every_architecture_of_the_pinned_transformers():
    doc = (ROOT / "docs" / "hf_support.md").read_text()
    for table in TABLES:
        section = doc.split(f"\n## {table}\n", 1)[1].split("\n## ", 1)[0]
        listed = set(re.findall(r"^\| `([^`]+)` \|", section, re.M))
        assert listed == set(architectures(table)), f"{table}: regenerate with make hf-sweep"
    for mode, bar in (("eager", 0.98), ("compile", 0.95)):
        m = re.search(rf"\| causal-lm \| {mode} \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|", doc)
        assert m, f"no causal-lm {mode} row with the eager column: regenerate with make hf-sweep"
        total, passed, eager, failed, cpu = map(int, m.groups())
        assert passed / (total - cpu) >= bar, mode
