"""`[train] init_from`: a new run starts from another run's (or checkpoint's, or Hugging Face export's) weights
with a fresh optimizer and the source's tokenizer, on new data; a source whose model differs in anything that
changes the math is refused naming each difference, unless init_strict = false, which loads what matches and
lists the rest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.trainer.conftest import make_corpus, write_config
from trainer.checkpoint import load_latest

REPO = Path(__file__).resolve().parents[2]
# A tiny lr: one AdamW step moves each weight by about lr at most, so the result must equal the source's.
FROZEN = {"optim": {"lr": 1e-9, "weight_decay": 0.0}, "schedule": {"warmup_iters": 0, "min_lr": 0.0}}


def _run(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer", "run", str(config), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def pretrained(make_config, tmp_path):
    config = make_config("base", train={"max_iters": 4, "sample_tokens": 0})
    assert _run(config).returncode == 0
    return tmp_path / "runs" / "base"


def _params(run_dir: Path) -> dict[str, np.ndarray]:
    return {k: v for k, v in load_latest(run_dir).tensors.items() if k.startswith("param.")}


@pytest.mark.parametrize("source_kind", ["run", "checkpoint", "huggingface"])
def test_fine_tuning_starts_from_the_source(make_config, tmp_path, pretrained, source_kind):
    source = {"run": pretrained, "checkpoint": pretrained / "ckpt-4", "huggingface": tmp_path / "hf"}[source_kind]
    if source_kind == "huggingface":
        done = subprocess.run([sys.executable, "-m", "trainer", "export", "--run", str(pretrained), "--out",
                               str(source)], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    new_text = tmp_path / "new.txt"
    new_text.write_text(make_corpus(600, seed=9), encoding="utf-8")
    config = make_config("tuned", data={"path": str(new_text)}, train={"max_iters": 1, "sample_tokens": 0,
                         "init_from": str(source)}, **FROZEN)
    done = _run(config)
    assert done.returncode == 0, done.stderr
    tuned = tmp_path / "runs" / "tuned"
    mine, base = _params(tuned), _params(pretrained)
    assert all(np.allclose(mine[k], base[k], rtol=0, atol=1e-7) for k in base)
    state = load_latest(tuned).state
    assert json.loads(state["tokenizer_json"]) == json.loads((pretrained / "tokenizer.json").read_text())
    assert int(np.asarray(load_latest(tuned).tensors["adam_step"])) == 1  # a fresh optimizer: one step so far
    again = _run(config, "--train.max_iters=2")  # resuming the fine-tuning run itself
    assert again.returncode == 0, again.stderr


def test_a_source_of_another_shape_is_refused(make_config, pretrained):
    config = make_config("wide", model={"n_embd": 48}, train={"init_from": str(pretrained), "sample_tokens": 0})
    done = _run(config)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "init_from" in done.stderr and "use the source's [model] settings" in done.stderr


def test_a_missing_source_is_refused(make_config, tmp_path):
    done = _run(make_config("lost", train={"init_from": str(tmp_path / "nowhere")}))
    assert done.returncode == 2 and "does not exist" in done.stderr and done.stderr.count("\n") == 1


@pytest.fixture(scope="module")
def source_run(tmp_path_factory, corpus) -> Path:
    """A 2-layer, 2-head, tied gpt2 run (the tiny config) that the mismatch cases start from."""
    root = tmp_path_factory.mktemp("source")
    done = _run(write_config(root, corpus, "base", train={"max_iters": 4, "sample_tokens": 0}))
    assert done.returncode == 0, done.stderr
    return root / "runs" / "base"


@pytest.fixture(scope="module")
def source_hf(source_run, tmp_path_factory) -> Path:
    """source_run exported as a Hugging Face GPT-2 directory."""
    out = tmp_path_factory.mktemp("hf") / "gpt2"
    done = subprocess.run([sys.executable, "-m", "trainer", "export", "--run", str(source_run), "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out


def _edited_hf(source_hf: Path, dest: Path, config: dict | None = None, untie: bool = False,
               drop_tokenizer: bool = False) -> Path:
    """A copy of the HF export with config.json fields changed (or the head untied, or no tokenizer)."""
    import shutil

    from safetensors.numpy import load_file, save_file

    shutil.copytree(source_hf, dest)
    doc = json.loads((dest / "config.json").read_text()) | (config or {})
    if untie:
        weights = load_file(str(dest / "model.safetensors"))
        weights["lm_head.weight"] = np.random.default_rng(0).normal(0, 0.02, weights["transformer.wte.weight"].shape
                                                                     ).astype(np.float32)
        save_file(weights, str(dest / "model.safetensors"))
        doc["tie_word_embeddings"] = False
    (dest / "config.json").write_text(json.dumps(doc))
    if drop_tokenizer:
        (dest / "tokenizer.json").unlink()
    return dest


# name -> (source: "run" or edits of the HF export, [model] overrides of the new run, needles in the error)
MISMATCHES = {
    "fewer_layers": ("run", {"n_layer": 1}, ("n_layer 2 there, 1 here", "source parameters this model lacks: h.1.*")),
    "untied_from_tied": ("run", {"tie_embeddings": False},
                         ("tie_embeddings true there, false here", "parameters the source lacks: lm_head.weight")),
    "tied_from_untied": ({"untie": True}, {}, ("tie_embeddings false there, true here",
                                               "source parameters this model lacks: lm_head.weight")),
    "n_head_with_the_same_shapes": ("run", {"n_head": 4}, ("n_head 2 there, 4 here",)),
    "n_kv_head": ("run", {"n_kv_head": 1}, ("n_kv_head 2 there, 1 here",
                                            "h.0.attn.c_attn.weight [96, 32] there, [64, 32] here")),
    "arch": ("run", {"arch": "llama"}, ('arch "gpt2" there, "llama" here', 'positions "learned" there, "rope" here')),
    "norm_eps": ("run", {"norm_eps": 1e-6}, ("norm_eps 1e-05 there, 1e-06 here",)),
    "hf_n_head": ({"config": {"n_head": 8}}, {}, ("n_head 8 there, 2 here",)),
    "hf_relu": ({"config": {"activation_function": "relu"}}, {}, ('activation "relu" there, "gelu_tanh" here',)),
    "hf_inverse_layer_scaling": ({"config": {"scale_attn_by_inverse_layer_idx": True}}, {},
                                 ('attention_scale "1/sqrt(head_dim) / (layer + 1)" there',)),
    "hf_positions": ({"config": {"n_positions": 32}}, {}, ("block_size 32 there, 16 here",)),
    "hf_not_gpt2_or_llama": ({"config": {"model_type": "bert"}}, {}, ("Hugging Face bert model",
                                                                      "GPT-2 and LLaMA")),
    "hf_without_tokenizer": ({"drop_tokenizer": True}, {}, ("has no tokenizer.json",
                                                            "--train.init_tokenizer=PATH/tokenizer.json")),
}


@pytest.mark.parametrize("name", sorted(MISMATCHES))
def test_a_mismatched_source_is_refused_naming_each_difference(name, tmp_path, corpus, source_run, source_hf):
    kind, model, needles = MISMATCHES[name]
    source = source_run if kind == "run" else _edited_hf(source_hf, tmp_path / "hf", **kind)
    config = write_config(tmp_path, corpus, "tuned", model=model, train={"init_from": str(source)})
    done = _run(config)
    err = done.stderr.strip()
    assert done.returncode == 2 and err.count("\n") == 0 and "Traceback" not in err, done.stderr
    assert err.startswith("trainer: error: [train] init_from")
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err}"
    if name not in ("hf_not_gpt2_or_llama", "hf_without_tokenizer"):
        assert "--train.init_strict=false" in err


def test_init_strict_false_loads_what_matches_and_lists_the_rest(tmp_path, corpus, source_run):
    config = write_config(tmp_path, corpus, "partial", model={"n_layer": 1, "tie_embeddings": False},
                          train={"init_from": str(source_run), "init_strict": False, "max_iters": 1,
                                 "sample_tokens": 0}, **FROZEN)
    done = _run(config)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("trainer: warning: init_from")]
    assert len(warnings) == 4, done.stderr
    assert "n_layer 2 there, 1 here (loaded anyway: init_strict = false)" in warnings[0]
    assert "tie_embeddings true there, false here" in warnings[1]
    assert "dropped 12 source parameter(s)" in warnings[2] and warnings[2].endswith(": h.1.*")
    assert "left 1 parameter(s) freshly initialised" in warnings[3] and warnings[3].endswith(": lm_head.weight")
    mine, base = _params(tmp_path / "runs" / "partial"), _params(source_run)
    assert any(k.startswith("param.h.1.") for k in base)
    for key in mine:
        if key in base:
            assert np.allclose(mine[key], base[key], rtol=0, atol=1e-7), key
    assert "param.h.1.ln_1.weight" not in mine and "param.lm_head.weight" in mine


def test_a_hf_source_without_a_tokenizer_takes_the_one_given(tmp_path, corpus, source_run, source_hf):
    source = _edited_hf(source_hf, tmp_path / "hf", drop_tokenizer=True)
    config = write_config(tmp_path, corpus, "given", train={"init_from": str(source), "max_iters": 1,
                          "sample_tokens": 0, "init_tokenizer": str(source_hf / "tokenizer.json")}, **FROZEN)
    done = _run(config)
    assert done.returncode == 0, done.stderr
    tuned = tmp_path / "runs" / "given"
    assert (tuned / "tokenizer.json").read_text() == (source_hf / "tokenizer.json").read_text()
    mine, base = _params(tuned), _params(source_run)
    assert all(np.allclose(mine[k], base[k], rtol=0, atol=1e-7) for k in base)


LLAMA = {"arch": "llama", "n_kv_head": 1, "bias": False, "tie_embeddings": False}


def test_a_llama_export_loads_strictly_and_a_changed_one_is_refused(tmp_path, corpus):
    base = write_config(tmp_path, corpus, "llama", model=LLAMA, train={"max_iters": 4, "sample_tokens": 0})
    assert _run(base, "--backend", "torch").returncode == 0
    hf = tmp_path / "hf-llama"
    done = subprocess.run([sys.executable, "-m", "trainer", "export", "--run", str(tmp_path / "runs" / "llama"),
                           "--out", str(hf)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    tuned = write_config(tmp_path, corpus, "tuned", model=LLAMA, train={"init_from": str(hf), "max_iters": 1,
                         "sample_tokens": 0}, **FROZEN)
    done = _run(tuned, "--backend", "torch")
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    mine, base_params = _params(tmp_path / "runs" / "tuned"), _params(tmp_path / "runs" / "llama")
    assert all(np.allclose(mine[k], base_params[k], rtol=0, atol=1e-7) for k in base_params)
    doc = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps(doc | {"hidden_act": "gelu", "rope_theta": 500000.0,
                                                      "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}))
    refused = _run(write_config(tmp_path, corpus, "refused", model=LLAMA, train={"init_from": str(hf)}),
                   "--backend", "torch")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    for needle in ('activation "swiglu_gelu" there, "swiglu_silu" here', "rope_base 500000.0 there, 10000.0 here",
                   'positions "rope scaled (llama3)" there, "rope" here'):
        assert needle in refused.stderr, refused.stderr


def test_gpt2_weights_named_as_the_hub_stores_them_load_too(tmp_path, source_hf):
    """The Hub's gpt2 model.safetensors names GPT2Model's tensors (no `transformer.` prefix) and keeps the
    causal-mask buffers (`h.N.attn.bias`): both read as the same parameters, nothing left unused."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from trainer.init_from_hf import load_hf_source

    hub = tmp_path / "hub"
    shutil.copytree(source_hf, hub)
    weights = {k.removeprefix("transformer."): v for k, v in load_file(str(source_hf / "model.safetensors")).items()}
    weights["h.0.attn.bias"] = np.tril(np.ones((1, 1, 16, 16), np.float32))
    save_file(weights, str(hub / "model.safetensors"))
    ours, theirs = load_hf_source(source_hf), load_hf_source(hub)
    assert theirs.unused == [] and sorted(theirs.params) == sorted(ours.params)
    assert all(np.array_equal(theirs.params[k], ours.params[k]) for k in ours.params)
    assert theirs.signature == ours.signature
