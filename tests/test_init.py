"""The package's top level: the public API, its training half imported on first use."""

import subprocess
import sys
from pathlib import Path

import pytest

import haste_hf


def test_import_leaves_the_training_api_unimported():
    code = "import sys, haste_hf; print(sorted(m for m in sys.modules if m.startswith('haste_hf.')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for module in (
        "training.trainer",
        "training.training_args",
        "training.callbacks",
        "recipe",
        "evaluation",
        "labels.layout",
        "labels.grouping",
        "data",
        "metrics",
    ):
        assert f"'haste_hf.{module}'" not in loaded, module


@pytest.mark.parametrize("name", haste_hf.__all__)
def test_every_public_name_resolves(name):
    assert getattr(haste_hf, name) is not None
    assert name in dir(haste_hf)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'HasteTrainr'"):
        haste_hf.HasteTrainr  # noqa: B018


def test_import_loads_no_pipeline_and_registers_when_transformers_loads():
    """`import haste_hf` loads neither torch nor transformers; the auto classes know HASTE models once transformers
    loads them, in either import order, and `transformers.pipelines` (4 s on 2 cores) stays unloaded."""
    code = (
        "from transformers import AutoConfig, AutoModel\n"
        "from transformers.models.auto.modeling_auto import MODEL_MAPPING\n"
        "from haste_hf import HasteConfig, HasteForExtremeClassification\n"
        "assert AutoConfig.for_model('haste_xmc', label_count=3, fan_in=4).__class__ is HasteConfig\n"
        "assert MODEL_MAPPING[HasteConfig] is HasteForExtremeClassification\n"
        "assert 'transformers.pipelines' not in sys.modules\n"
    )
    light = "import sys, haste_hf\nassert not {'torch', 'transformers'} & set(sys.modules), 'heavy import'\n"
    for first in (light, "import sys, transformers.models.auto.modeling_auto, haste_hf\n"):
        subprocess.run([sys.executable, "-c", first + code], check=True)


@pytest.mark.parametrize("module", ["transformers.trainer_utils", "haste_hf.recipe", "haste_hf.training.trainer"])
def test_the_registration_imports_nothing_half_loaded(module):
    """The auto classes register while transformers loads `modeling_auto`, which can happen in the middle of another
    module's import (`transformers.trainer_utils` imports peft, which imports the auto models): the modeling file's
    imports must not need that module. In a fresh process, as `haste-hf train` runs."""
    code = f"import haste_hf, {module}\nfrom transformers.models.auto.modeling_auto import MODEL_MAPPING\nassert MODEL_MAPPING[haste_hf.HasteConfig] is haste_hf.HasteForExtremeClassification\n"
    subprocess.run([sys.executable, "-c", code], check=True)


PACKAGE_MODULES = sorted(
    "haste_hf." + ".".join(path.relative_to(Path(haste_hf.__file__).parent).with_suffix("").parts)
    for path in Path(haste_hf.__file__).parent.rglob("*.py")
    if path.name not in ("__init__.py", "__main__.py") and "evaluate_metric" not in path.parts
)


@pytest.mark.parametrize("module", PACKAGE_MODULES)
def test_every_module_imports_first_in_a_fresh_interpreter(module):
    # Loading transformers' auto classes registers HASTE's, which imports the modeling code: a module that the
    # modeling code imports and that loads the auto classes at its top fails when it is the first one imported.
    result = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
