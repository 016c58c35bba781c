"""Which engines `ragline worker generation --gpus` and `ragline up` start, on a faked device list."""

from __future__ import annotations

import pytest
from ragline.broker.config.gpus import Gpu

from ragline.placement import Placement, PlacementError, parse_gpus, place_engines, spare_gpus


def _gpus(*indices: int) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, "NVIDIA H200", 143_771, 4, (9, 0)) for i in indices)


EIGHT = _gpus(*range(8))


def test_all_is_one_engine_per_gpu_this_process_may_use() -> None:
    assert place_engines("all", EIGHT) == [Placement((i,)) for i in range(8)]
    # CUDA_VISIBLE_DEVICES=4,6 for this process: those two, as nvidia-smi numbers them.
    assert place_engines("ALL ", _gpus(4, 6)) == [Placement((4,)), Placement((6,))]


def test_a_cpu_host_runs_one_engine_on_the_cpu() -> None:
    assert place_engines("all", ()) == [Placement()]
    assert Placement().environment() == {} and Placement().name == "generation-worker"


def test_a_list_picks_those_gpus_in_its_order() -> None:
    assert place_engines("3,1", EIGHT) == [Placement((3,)), Placement((1,))]
    assert parse_gpus(" 0, 1 ") == (0, 1) and parse_gpus("all") is None


def test_tensor_parallel_cuts_the_gpus_into_engines_of_n() -> None:
    assert place_engines("all", EIGHT, tensor_parallel=8) == [Placement(tuple(range(8)))]
    assert place_engines("all", EIGHT, tensor_parallel=2) == [
        Placement((0, 1)),
        Placement((2, 3)),
        Placement((4, 5)),
        Placement((6, 7)),
    ]
    assert place_engines("6,7", EIGHT, tensor_parallel=2) == [Placement((6, 7))]


@pytest.mark.parametrize(
    ("spec", "available", "tp", "says"),
    [
        ("0,9", EIGHT, 1, "no GPU 9 here"),
        ("0", (), 1, "no GPU is visible"),
        ("all", (), 2, "none is visible"),
        ("all", _gpus(0, 1, 2), 2, "do not divide into engines of RAGLINE_TENSOR_PARALLEL=2"),
        ("1,1", EIGHT, 1, "listed twice"),
        ("gpu0", EIGHT, 1, "`all` or GPU indices"),
        ("", EIGHT, 1, "`all` or GPU indices"),
    ],
)
def test_what_cannot_be_placed_is_refused_with_why(
    spec: str, available: tuple[Gpu, ...], tp: int, says: str
) -> None:
    with pytest.raises(PlacementError, match=says):
        place_engines(spec, available, tp)


def test_each_engine_is_pinned_and_labelled_by_its_gpus() -> None:
    one, two = Placement((2,)), Placement((0, 1))
    assert one.environment() == {
        "CUDA_VISIBLE_DEVICES": "2",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "RAGLINE_ENGINE_GPUS": "2",
    }
    assert two.environment()["CUDA_VISIBLE_DEVICES"] == "0,1" and two.label == "0,1"
    assert (one.name, two.name) == ("generation-worker-gpu2", "generation-worker-gpu0-1")


def test_spare_gpus_are_those_no_engine_holds() -> None:
    assert spare_gpus(EIGHT, place_engines("0,1,2", EIGHT)) == (3, 4, 5, 6, 7)
    assert spare_gpus(EIGHT, place_engines("all", EIGHT)) == ()
