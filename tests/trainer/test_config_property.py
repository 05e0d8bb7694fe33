"""Property: the config loader never crashes: any TOML text either loads or raises ConfigError."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.trainer.conftest import to_toml
from trainer.config import SECTIONS, Config, load_config_text
from trainer.errors import ConfigError

VALID_KEYS = {name: [f.name for f in dataclasses.fields(cls)] for name, cls in SECTIONS.items()}

scalars = st.one_of(
    st.integers(min_value=-3, max_value=5000), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=0, max_value=1), st.booleans(),
    st.sampled_from(["gpt2", "llama", "bpe", "cosine", "linear", "constant", "skip", "stop", "shakespeare", "none",
                     "", "x/y", "run-1"]),
    st.text(max_size=8),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3))
section_names = st.one_of(st.sampled_from(sorted(SECTIONS)), st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1,
                                                                      max_size=8))


@st.composite
def documents(draw):
    """A mostly well-formed document: known sections with known and unknown keys."""
    doc = {}
    for section in draw(st.lists(section_names, max_size=4, unique=True)):
        keys = VALID_KEYS.get(section, []) + ["bogus", "n_layers"]
        names = draw(st.lists(st.sampled_from(keys), max_size=5, unique=True))
        doc[section] = {k: draw(values) for k in names}
    return doc


def _load(text: str) -> None:
    try:
        cfg = load_config_text(text, "prop.toml")
    except ConfigError as exc:
        assert str(exc).startswith("prop.toml")
        return
    assert isinstance(cfg, Config)
    assert cfg.model.n_embd % cfg.model.n_head == 0 and cfg.model.n_head % cfg.model.n_kv_head == 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_structured_documents_load_or_raise_config_error(doc):
    _load(to_toml(doc))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_loads_or_raises_config_error(text):
    _load(text)


@settings(max_examples=100, deadline=None)
@given(documents(), st.integers(min_value=0, max_value=60), st.text(max_size=5))
def test_mangled_documents_load_or_raise_config_error(doc, cut, junk):
    text = to_toml(doc)
    _load(text[:cut] + junk + text[cut:])
