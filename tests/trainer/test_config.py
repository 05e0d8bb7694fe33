"""Config loading: every bad input is a ConfigError naming the key, value and what is allowed; exit 2, no traceback."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_python
from trainer.cli import main
from trainer.config import Config, ModelConfig, load_config, load_config_text
from trainer.errors import ConfigError


def test_defaults_load_and_resolve():
    cfg = load_config_text("")
    assert cfg == load_config(None)
    assert cfg.model.n_kv_head == cfg.model.n_head
    assert cfg.schedule.lr_decay_iters == cfg.train.max_iters
    assert cfg.data.dataset == "shakespeare"


@pytest.mark.parametrize("name", ["shakespeare", "llama-tiny", "alpha-8l"])
def test_shipped_configs_load(name):
    from trainer.cli import DEFAULT_CONFIG

    cfg = load_config(DEFAULT_CONFIG.parent / f"{name}.toml")
    assert cfg.run.name == name
    if name == "llama-tiny":
        assert (cfg.model.arch, cfg.model.n_kv_head, cfg.model.tie_embeddings) == ("llama", 2, False)
    if name == "alpha-8l":
        m = cfg.model
        assert (m.n_layer, m.n_embd, m.n_head, m.block_size, m.vocab_size, cfg.train.batch_size) == \
            (8, 384, 8, 512, 4096, 20)


@pytest.mark.parametrize("text, needles", [
    ("[model]\nn_layers = 4\n", ["n_layers", "[model]", "valid keys", "n_layer", "n_embd"]),
    ("[modle]\nn_layer = 4\n", ["[modle]", "valid sections", "model", "train"]),
    ("lr = 1\n", ["[lr]", "inside a section"]),
    ('[model]\nn_layer = "4"\n', ["n_layer", '"4"', "integer"]),
    ("[model]\nbias = 1\n", ["bias", "true or false"]),
    ("[optim]\nlr = -0.1\n", ["lr", "-0.1", "positive"]),
    ("[model]\nn_embd = 130\nn_head = 4\n", ["n_embd", "130", "divisible by n_head (4)"]),
    ("[model]\nn_head = 6\nn_kv_head = 4\nn_embd = 96\n", ["n_head", "6", "divisible by n_kv_head (4)"]),
    ('[model]\narch = "bert"\n', ["arch", '"bert"', '"gpt2", "llama"']),
    ('[schedule]\ndecay = "step"\n', ["decay", '"step"', "cosine"]),
    ('[train]\nnan_policy = "ignore"\n', ["nan_policy", '"skip", "stop"']),
    ("[optim]\nbetas = [0.9]\n", ["betas", "list of 2"]),
    ("[optim]\nbetas = [0.9, 1.5]\n", ["betas", "[0, 1)"]),
    ("[data]\nval_fraction = 1.0\n", ["val_fraction", "between 0 and 1"]),
    ('[data]\npath = "a.txt"\ndataset = "shakespeare"\n', ["path", "not both"]),
    ("[schedule]\nwarmup_iters = 50\nlr_decay_iters = 10\n", ["lr_decay_iters", "10", "warmup_iters (50)"]),
    ("[model]\nn_layer = 2\n[model]\nn_head = 2\n", ["malformed TOML", "line 3"]),
    ("[model\nn_layer = 2\n", ["malformed TOML", "line 1"]),
    ("[train]\nmax_iters = 10 20\n", ["malformed TOML", "line 2, column"]),
])
def test_bad_configs_name_the_problem(text, needles):
    with pytest.raises(ConfigError) as info:
        load_config_text(text, "x.toml")
    for needle in needles:
        assert needle in str(info.value)


def test_overrides_are_parsed_as_toml_and_validated():
    cfg = load_config_text("[model]\nn_layer = 4\n", overrides=["model.n_layer=2", "optim.betas=[0.8, 0.9]",
                                                              "run.name=quick", "train.spike_threshold=none"])
    assert (cfg.model.n_layer, cfg.optim.betas, cfg.run.name, cfg.train.spike_threshold) == (2, (0.8, 0.9),
                                                                                          "quick", None)
    with pytest.raises(ConfigError, match="unknown key 'n_layerz'"):
        load_config_text("", overrides=["model.n_layerz=2"])
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config_text("", overrides=["model=2"])


def test_config_roundtrips_through_dict():
    from trainer.config import config_from_dict

    cfg = load_config_text('[model]\narch = "llama"\nn_kv_head = 2\n[run]\nname = "x"\n')
    again = config_from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and isinstance(again, Config) and isinstance(again.model, ModelConfig)


def test_cli_config_errors_exit_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nn_embd = 130\nn_head = 4\n")
    proc = run_python("-m", "trainer", "run", str(bad), "--backend", "torch")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "n_embd = 130" in proc.stderr and "n_head (4)" in proc.stderr
    bad.write_text("[train]\nmax_iters = = 3\n")
    proc = run_python("-m", "trainer", "run", str(bad), "--train.max_iters=3")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "line 2, column" in proc.stderr
    proc = run_python("-m", "trainer", "run", str(tmp_path / "missing.toml"))
    assert proc.returncode == 2 and "cannot read config" in proc.stderr


def test_cli_override_errors(make_config, capsys):
    cfg = make_config()
    assert main(["run", str(cfg), "--backend", "torch", "--model.n_layerz=3"]) == 2
    err = capsys.readouterr().err
    assert "n_layerz" in err and "valid keys" in err
    assert main(["run", str(cfg), "--backend", "torch", "stray"]) == 2
    assert "unrecognized argument 'stray'" in capsys.readouterr().err


def test_block_size_beyond_data_is_a_config_error(make_config, capsys):
    cfg = make_config(model={"block_size": 100_000})
    assert main(["run", str(cfg), "--backend", "torch"]) == 2
    err = capsys.readouterr().err
    assert "block_size = 100000" in err and "at most" in err


def test_help_is_useful():
    for cmd in ("run", "sample", "eval", "prepare"):
        proc = run_python("-m", "trainer", cmd, "--help")
        assert proc.returncode == 0 and "usage:" in proc.stdout
    assert "--section.key=value" in run_python("-m", "trainer", "run", "--help").stdout
