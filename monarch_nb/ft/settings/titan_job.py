"""torchtitan 0.3's own job form, read into a :class:`RunConfig`: every leaf honoured or refused by name.

A torchtitan 0.3 job is a config-registry function (``--module llama3 --config llama3_debugmodel``,
or the user's own module) plus ``--section.key value`` overrides, parsed by torchtitan's own
``ConfigManager`` (tyro). :func:`load` does exactly that, turning its failures into one clear line:
an unknown module lists the shorthands, an unknown function the module's functions, an unknown
field or a value of the wrong type names the flag. :func:`read` then walks every leaf of the
config tree and gives each a :class:`Leaf` verdict from :data:`RULES`: *honoured* (it sets a
RunConfig field, or its value is what monarch_nb does anyway) or *refused* (monarch_nb cannot apply
that value; the verdict says what it supports). No leaf is passed over: a leaf with no rule is
refused too, so a torchtitan upgrade that adds a field shows up here instead of being ignored.

The model is read as a whole: ``model_spec`` is honoured when it is torchtitan's own Llama 3 flavour
of that name, unchanged; each leaf that differs from it is refused by its path.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

from .titan_rules import RULES, Refuse, get_path, section_rule

SHORTHAND_MODULES = ("llama3", "qwen3", "torchft.llama3")  # what this project has read through; any module works


class JobRefused(ValueError):
    """The job names values monarch_nb cannot apply; the message lists each refused leaf."""


@dataclass(frozen=True)
class Leaf:
    """One leaf of the config tree and what monarch_nb makes of it."""

    path: str  # "training.steps"
    value: Any
    honoured: bool
    becomes: str  # honoured: what it became ("steps = 40"); refused: why, and what is supported

    def line(self) -> str:
        mark = "  " if self.honoured else "! "
        return f"{mark}{self.path} = {_short(self.value)}  ->  {self.becomes}"


# ---- loading --------------------------------------------------------------------------------------


def load(argv: Sequence[str]) -> Any:
    """torchtitan's config for ``--module M --config F [--section.key value ...]``, through its own
    ConfigManager; a ``ValueError`` with one line naming what is wrong and the fix."""
    from torchtitan.config import ConfigManager

    import contextlib
    import io
    import re

    argv = list(argv)
    _cwd_importable()
    told = io.StringIO()
    with warnings.catch_warnings(), _quiet(), contextlib.redirect_stderr(told), contextlib.redirect_stdout(told):
        warnings.simplefilter("ignore")
        try:
            return ConfigManager().parse_args(argv)
        except SystemExit as exc:  # tyro drew its message in a box: keep its words, one line
            if exc.code == 0:  # --help: let the caller show it
                raise _HelpShown(told.getvalue()) from None
            lines = (re.sub(r"[│╭╰─╮╯]|-{3,}", " ", line).strip() for line in told.getvalue().splitlines())
            words = " ".join(w for w in lines if w and not w.startswith(("For full helptext", "Available subcommands",
                                                                           "activation-checkpoint:")))
            raise ValueError(f"torchtitan's parser refused the job: {words[:600]} "
                             "(`monarch-nb check-job --module M --config F --help` lists the fields)") from None
        except ImportError as exc:
            text = str(exc)
            if "supported modules" not in text:
                text += f"; shorthands: {', '.join(_shorthands())}"
            raise ValueError(f"module: {text}") from None
        except ValueError as exc:
            raise ValueError(f"config: {exc}") from None


def _cwd_importable() -> None:
    """A user's own ``--module`` next to the notebook or the shell resolves, as under ``python -m``
    (torchtitan's own launch): the working directory is on the import path."""
    import os
    import sys

    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _shorthands() -> list[str]:
    from torchtitan.experiments import _supported_experiments
    from torchtitan.models import _supported_models

    return sorted(_supported_models | _supported_experiments)


class _HelpShown(Exception):
    """``--help`` was asked for; the text is torchtitan's own field list."""


class _quiet:
    """torchtitan logs config warnings at WARNING while it parses; a check prints its own."""

    def __enter__(self) -> None:
        logging.disable(logging.WARNING)

    def __exit__(self, *exc: Any) -> None:
        logging.disable(logging.NOTSET)


# ---- reading ---------------------------------------------------------------------------------------


def leaves(config: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Every leaf of a config tree, as (dotted path, value); ``model_spec`` is read apart."""
    out = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        path = f"{prefix}{f.name}"
        if path == "model_spec":
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += leaves(value, path + ".")
        else:
            out.append((path, value))
    return out


def read(config: Any) -> tuple[dict[str, Any], list[Leaf]]:
    """(RunConfig fields, a verdict per leaf) for a torchtitan config."""
    fields: dict[str, Any] = {}
    verdicts = _model_verdicts(config, fields)
    for path, value in leaves(config):
        rule = RULES.get(path) or section_rule(path)
        if rule is None:
            verdicts.append(Leaf(path, value, False, "monarch_nb has no rule for this field yet; it cannot "
                                 "apply it (leave it at torchtitan's default or drop it)"))
            continue
        try:
            sets, became = rule(value, config)
        except Refuse as why:
            verdicts.append(Leaf(path, value, False, str(why)))
            continue
        fields.update(sets)
        verdicts.append(Leaf(path, value, True, became))
    titan = {k.split(".", 1)[1]: fields.pop(k) for k in list(fields) if k.startswith("titan.")}
    if titan:
        from .titan_parts import TitanParts

        fields["titan"] = TitanParts(**titan)
    return fields, verdicts


def _model_verdicts(config: Any, fields: dict[str, Any]) -> list[Leaf]:
    """The model is honoured as a whole: torchtitan's registry flavour of its name, unchanged. Llama 3
    trains as monarch_nb's flavour of that name (the same build); another registry model (qwen3)
    through its model spec, ``model = "MODULE/FLAVOR"``."""
    from .flavors import FLAVOR_NAMES, SPEC_MODULES, has_experts, model_spec

    spec = getattr(config, "model_spec", None)
    name, flavor = getattr(spec, "name", None), getattr(spec, "flavor", None)
    module = "llama3" if name in ("llama3", "torchft/llama3") else name  # torchft's registry serves llama3
    if module != "llama3" and module not in SPEC_MODULES:
        return [Leaf("model_spec", f"{name}/{flavor}", False,
                     f"monarch_nb trains torchtitan's llama3 ({', '.join(FLAVOR_NAMES)}) and, through their model "
                     f"spec, {', '.join(SPEC_MODULES)}; {name!r} does not run here (docs/torchtitan_jobs.md says why)")]
    if module == "llama3" and flavor not in FLAVOR_NAMES:
        return [Leaf("model_spec.flavor", flavor, False, f"not a llama3 flavour; supported: {', '.join(FLAVOR_NAMES)}")]
    model = flavor if module == "llama3" else f"{module}/{flavor}"
    try:
        registry = model_spec(f"{module}/{flavor}") if module != "llama3" else _llama3_spec(flavor)
    except ValueError as exc:
        return [Leaf("model_spec.flavor", flavor, False, str(exc))]
    if module != "llama3" and has_experts(registry.model):
        return [Leaf("model_spec.flavor", flavor, False, f"{module}/{flavor} has mixture-of-experts layers; monarch_nb "
                     "trains dense models (no expert parallelism or expert-bias balancing across groups)")]
    want = dict(leaves_of(registry.model, "model_spec.model."))
    have = dict(leaves_of(spec.model, "model_spec.model."))
    changed = [Leaf(path, value, False, f"differs from torchtitan's {module} {flavor!r} ({_short(want.get(path))}); "
                    "monarch_nb builds a flavour by its name: pick another flavour instead")
               for path, value in have.items() if _same_text(value) != _same_text(want.get(path))]
    if changed:
        return changed
    fields["model"] = model
    how = "torchtitan's flavour, unchanged" + ("" if module == "llama3" else ", built through its model spec")
    return [Leaf("model_spec", f"{module}/{flavor}", True, f"model = {model!r} ({how})")]


def _llama3_spec(flavor: str) -> Any:
    from torchtitan.models.llama3 import model_registry

    return model_registry(flavor)


def leaves_of(obj: Any, prefix: str) -> list[tuple[str, Any]]:
    """Leaves of any dataclass tree (lists of dataclasses by index), for comparing two models."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [leaf for f in dataclasses.fields(obj) for leaf in leaves_of(getattr(obj, f.name), f"{prefix}{f.name}.")]
    if isinstance(obj, list) and obj and dataclasses.is_dataclass(obj[0]):
        return [leaf for i, item in enumerate(obj) for leaf in leaves_of(item, f"{prefix}{i}.")]
    return [(prefix[:-1], obj)]


def run_config(argv: Sequence[str], **overrides: Any) -> Any:
    """A validated RunConfig for a torchtitan 0.3 job; ``overrides`` are monarch_nb's own fields
    (``replicas``, ``spares``, ``job``, ...). ``JobRefused`` lists every leaf it cannot apply."""
    return run_config_of(load(argv), **overrides)


def is_titan_config(obj: Any) -> bool:
    """A torchtitan 0.3 ``Trainer.Config`` (or torchft's), as a registry function returns it."""
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type) and hasattr(obj, "model_spec") \
        and hasattr(obj, "training")


def run_config_of(config: Any, **overrides: Any) -> Any:
    """:func:`run_config` for a ``Trainer.Config`` already built (in Python, or by :func:`load`)."""
    from .config import RunConfig

    fields, verdicts = read(config)
    if "replicas" in overrides and "replicas" in fields and overrides["replicas"] != fields["replicas"]:
        raise JobRefused(f"replicas: --replicas {overrides['replicas']} and --fault_tolerance.group_size "
                         f"{fields['replicas']} disagree (torchft's group_size is the number of replica groups)")
    refused = [v for v in verdicts if not v.honoured]
    if refused:
        raise JobRefused(f"{len(refused)} field(s) of this job cannot be applied by monarch_nb:\n"
                         + "\n".join(v.line() for v in refused))
    return RunConfig(**{**fields, **overrides}).validate()


def _same_text(value: Any) -> str:
    """A leaf's repr without object addresses: a flavour's init functions are made anew per call."""
    import re

    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


def check(argv: Sequence[str]) -> tuple[int, str]:
    """What ``monarch-nb check-job ARGS`` prints, and its exit code: every leaf and what it became
    (0), with refusals (1), or the job's parse error (2). Nothing is started."""
    try:
        fields, verdicts = read(load(argv))
    except _HelpShown as shown:
        return 0, str(shown)
    except ValueError as exc:
        return 2, f"monarch-nb check-job: {exc}"
    refused = [v for v in verdicts if not v.honoured]
    lines = [v.line() for v in verdicts]
    lines.append(f"{len(verdicts)} fields: {len(verdicts) - len(refused)} honoured, {len(refused)} refused (marked !)")
    if not refused:
        from .config import RunConfig

        try:
            RunConfig(**fields).validate()
        except ValueError as exc:
            return 1, "\n".join(lines + [f"refused as a whole: {exc}"])
    return (1 if refused else 0), "\n".join(lines)




def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
