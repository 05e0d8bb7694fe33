"""matmul.select's BLOCKS (what the table and the tuner reason with) against the grids the kernels launch, and the
tuning store the rule reads (helios.kernels.contract.tuning): files stored before dtypes were keyed still load."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from helios.kernels import matmul as mm
from helios.kernels.contract import tuning
from helios.kernels.matmul import select as sel
from helios.spirv import ceil_div


def _variants_of(tiling: str) -> list[str]:
    """Every variant of matmul_nn that runs `tiling`: `[bf16_|fp16_][out32_]<tiling>[_scalar]`."""
    pattern = re.compile(r"(?:(?:bf16|fp16)_)?(?:out32_)?(?P<tiling>.+?)(?:_scalar)?")
    return [n for n in mm.KERNELS["nn"].variants if pattern.fullmatch(n)["tiling"] == tiling]


@pytest.mark.parametrize("tiling", list(sel.BLOCKS))
def test_blocks_are_what_the_grids_launch(tiling):
    """Each tiling's (rows, columns) of C per workgroup is the block its grid function divides the output by."""
    bm, bn = sel.BLOCKS[tiling]
    names = _variants_of(tiling)
    assert names, f"no matmul variant runs {tiling}"
    kernel = mm.KERNELS["nn"]
    for name in names:
        variant = kernel.variants[name]
        for M, N, batch in ((1, 1, 1), (bm, bn, 2), (bm + 1, bn - 1, 1), (5 * bm + 3, 3 * bn, 3)):
            assert mm.grid((M, N, batch), variant) == (ceil_div(N, bn), ceil_div(M, bm), batch), (name, M, N)


def test_blocks_negative_control():
    """The comparison above can fail: a block off by one row gives another grid."""
    variant = mm.KERNELS["nn"].variants["reg8x8"]
    bm, bn = sel.BLOCKS["reg8x8"]
    assert mm.grid((bm + 1, bn, 1), variant) != (ceil_div(bn, bn), ceil_div(bm + 1, bm + 1), 1)


def _info(name="dev", build="1.0"):
    return SimpleNamespace(name=name, driver_name="drv", driver_info=build, driver_version=1, profile=None)


def test_store_round_trip_and_keys(tmp_path):
    store = tuning.TuningStore(tmp_path)
    info = _info()
    path = store.save(info, "matmul", {"nn:8x8x8": "reg8x8", tuning.key("nn:8x8x8", "bf16"): "tiled32"})
    assert path == tmp_path / "tuning-dev-drv-1.0.json"
    fresh = tuning.TuningStore(tmp_path)  # another process
    assert fresh.winner(info, "matmul", "nn:8x8x8") == "reg8x8"
    assert fresh.winner(info, "matmul", "nn:8x8x8:bf16") == "tiled32"
    assert fresh.winner(_info(build="1.1"), "matmul", "nn:8x8x8") is None  # another driver build
    assert fresh.winner(info, "attention", "nn:8x8x8") is None  # another family


def test_store_reads_files_written_before_it(tmp_path):
    """The layout matmul.select wrote: device description plus a "matmul" section of {shape key: tiling}; a
    tiling helios no longer offers is dropped."""
    info = _info()
    (tmp_path / f"tuning-{tuning.device_key(info)}.json").write_text(json.dumps(
        {"device": {"name": "dev", "driver": "drv 1.0", "driver_version": 1},
         "matmul": {"nn:40x44x12": "tiled64", "tn:7x9x11x2": "reg8x8", "nt:1x1x1": "reg64x64"}}))
    store = tuning.TuningStore(tmp_path)
    assert sel.load_tuning(info, store) == {"nn:40x44x12": "tiled64", "tn:7x9x11x2": "reg8x8"}
    sel.save_tuning(info, {"nn:1x2x3": "tiled32"}, store)
    data = json.loads(store.path(info).read_text())
    assert data["device"]["name"] == "dev" and data["matmul"]["nn:40x44x12"] == "tiled64"
    assert data["matmul"]["nn:1x2x3"] == "tiled32"
