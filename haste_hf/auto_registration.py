# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Registers the HASTE classes with transformers' auto classes without importing transformers first.

`import haste_hf` stays light (no torch, no transformers: the command line answers before either loads), yet
after it `AutoConfig`, `AutoModel` and `AutoModelForSequenceClassification` know the model type `haste_xmc`, and
`pipeline("text-classification")` serves a HASTE model with `HasteTextClassificationPipeline`. transformers has no
plugin entry points, so the registration runs where transformers' modules load: a post-import hook (as
`wrapt.register_post_import_hook`) waits for `configuration_auto` (then registers the configuration),
`modeling_auto` (then the model) and `transformers.pipelines` (then the pipeline), and steps aside once all are
done. When they are already loaded, `import haste_hf` registers at once. Nothing of transformers is patched: the
registration uses `AutoConfig.register` / `AutoModel.register`, as any model defined outside transformers does, and
names HASTE's pipeline as the `text-classification` task's class in transformers' pipeline registry, which builds
transformers' own `TextClassificationPipeline` for every other model (see `register_pipeline`).
"""

import importlib
import importlib.abc
import sys


CONFIGURATION_AUTO = "transformers.models.auto.configuration_auto"
MODELING_AUTO = "transformers.models.auto.modeling_auto"
HASTE_CONFIGURATION = f"{__package__}.modeling.configuration_haste"
HASTE_MODELING = f"{__package__}.modeling.modeling_haste"
PIPELINES = "transformers.pipelines"
HASTE_PIPELINE = f"{__package__}.modeling.pipeline_haste"
PIPELINE_TASK = "text-classification"
_registered: set[str] = set()


def _is_loaded(name: str, just_loaded: str | None) -> bool:
    module = sys.modules.get(name)
    return module is not None and (name == just_loaded or not getattr(module.__spec__, "_initializing", False))


def _is_loading(name: str, just_loaded: str | None) -> bool:
    return name in sys.modules and not _is_loaded(name, just_loaded)


def register_available(just_loaded: str | None = None) -> None:
    """Registers what transformers has loaded so far. A HASTE module still loading (it imports transformers, which
    runs this hook) is left to the hook that runs when it has loaded."""
    if (
        "config" not in _registered
        and _is_loaded(CONFIGURATION_AUTO, just_loaded)
        and not _is_loading(HASTE_CONFIGURATION, just_loaded)
    ):
        from transformers import AutoConfig

        HasteConfig = importlib.import_module(HASTE_CONFIGURATION).HasteConfig
        AutoConfig.register(HasteConfig.model_type, HasteConfig, exist_ok=True)
        HasteConfig.register_for_auto_class()
        # The installed package serves `pipeline()` without remote code (see `HasteConfig.custom_pipelines`).
        HasteConfig.pipeline_is_installed = True
        _registered.add("config")
    if (
        "model" not in _registered
        and _is_loaded(MODELING_AUTO, just_loaded)
        and not _is_loading(HASTE_MODELING, just_loaded)
    ):
        from transformers import AutoModel, AutoModelForSequenceClassification

        modeling = importlib.import_module(HASTE_MODELING)
        config_class, model_class = modeling.HasteConfig, modeling.HasteForExtremeClassification
        AutoModel.register(config_class, model_class, exist_ok=True)
        AutoModelForSequenceClassification.register(config_class, model_class, exist_ok=True)
        model_class.register_for_auto_class("AutoModel")  # `HasteConfig.to_dict` names the other auto class
        _registered.add("model")
    if (
        "pipeline" not in _registered
        and _is_loaded(PIPELINES, just_loaded)
        and not _is_loading(HASTE_PIPELINE, just_loaded)
    ):
        register_pipeline()
        _registered.add("pipeline")
    if len(_registered) == 3 and _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)


def register_pipeline() -> None:
    """Names `HasteTextClassificationPipeline` as the class `pipeline("text-classification")` (and its alias
    `sentiment-analysis`) builds. Built for a model that is not a HASTE model it returns transformers' own
    `TextClassificationPipeline`, so every other model's pipeline stays what it was.

    A `config.json` cannot do this: transformers reads its `custom_pipelines` as remote code, refused without
    `trust_remote_code=True` (which is why the installed `HasteConfig` names none); the task's entry in
    `PIPELINE_REGISTRY` is where a package names the class of a task, as `PIPELINE_REGISTRY.register_pipeline` does
    (not called: it warns that it overwrites, and marks the class for `Pipeline.save_pretrained` to write as remote
    code)."""
    from transformers.pipelines import PIPELINE_REGISTRY

    pipeline_class = importlib.import_module(HASTE_PIPELINE).HasteTextClassificationPipeline
    task = PIPELINE_REGISTRY.supported_tasks[PIPELINE_TASK]
    PIPELINE_REGISTRY.supported_tasks[PIPELINE_TASK] = {**task, "impl": pipeline_class}


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of the six modules above so that `register_available` runs once
    each has executed."""

    watched = (CONFIGURATION_AUTO, MODELING_AUTO, PIPELINES, HASTE_CONFIGURATION, HASTE_MODELING, HASTE_PIPELINE)

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.watched:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = getattr(finder, "find_spec", lambda *args: None)(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RegisteringLoader(spec.loader, fullname)
        return spec


class _RegisteringLoader(importlib.abc.Loader):
    def __init__(self, loader, name):
        self.loader, self.name = loader, name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        register_available(just_loaded=self.name)

    def __getattr__(self, name):  # `get_source`, `get_filename`, ... of the wrapped loader
        return getattr(self.loader, name)


_HOOK = _RegisterAfterImport()


def install() -> None:
    """Registers now what is loaded, and the rest when transformers loads it."""
    if _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)
    register_available()
