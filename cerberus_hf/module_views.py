"""Views of a model: per-call variants of a shared base that leave the base itself untouched.

A decoding call sometimes needs the base to compute differently: only its first layers (Kangaroo drafting),
some layers standing aside (Kangaroo verification reusing its drafting work), another attention function
(strict verification), another generation config (the heads' defaults). Changing the base for the duration
of the call would change it for every other thread calling it meanwhile, so a call instead runs a *view*:
a shallow copy of each module on the way from the root to what differs, sharing every parameter, buffer,
hook and untouched submodule with the base. Building one costs microseconds; nothing of it outlives the
call unless the caller keeps it.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from torch import nn

from .compat import ATTN_IMPLEMENTATION_FIELD


def module_view(module: nn.Module, children: dict[str, nn.Module] | None = None, **attributes: Any) -> nn.Module:
    """A copy of ``module`` that shares its parameters, buffers, hooks and submodules, except for the
    ``children`` given (submodules by name) and the plain ``attributes`` set on the copy only (e.g.
    ``config``, ``generation_config``, or ``forward`` for an instance forward)."""
    view = copy.copy(module)
    view.__dict__["_modules"] = {**module._modules, **(children or {})}
    for name, value in attributes.items():
        view.__dict__[name] = value
    return view


def replace_modules(root: nn.Module, replacements: dict[nn.Module, nn.Module]) -> nn.Module:
    """A view of ``root`` in which each module of ``replacements`` (keys: the base's modules, by identity) is
    replaced by its value; every module on the way to one is viewed (`module_view`), the rest is shared. The walk
    stops at a replaced module: replacing a module high in the tree (the decoder rather than its layers) keeps it
    short, which matters where a view is built every decoding step."""
    if root in replacements:
        return replacements[root]
    children = _changed_children(root, lambda child: replace_modules(child, replacements))
    return module_view(root, children) if children else root


def with_forward(module: nn.Module, forward: Callable[..., Any]) -> nn.Module:
    """A view of ``module`` whose forward is ``forward`` (called with the view's arguments; hooks still run)."""
    return module_view(module, forward=forward)


def config_view(config: Any, **values: Any) -> Any:
    """A shallow copy of a transformers config with ``values`` set on the copy only. Set plain fields (e.g.
    ``_attn_implementation_internal``, not the ``_attn_implementation`` property, whose setter also writes the
    sub-configs the copy shares with the original)."""
    view = copy.copy(config)
    for name, value in values.items():
        setattr(view, name, value)
    return view


def with_configs(root: nn.Module, configs: dict[int, Any]) -> nn.Module:
    """A view of ``root`` in which every module whose ``config`` is one of ``configs``' keys (by ``id``) reads
    the config mapped to it instead (its submodules first: they may read the config too)."""
    children = _changed_children(root, lambda child: with_configs(child, configs))
    config = configs.get(id(getattr(root, "config", None)))
    if config is not None:
        return module_view(root, children, config=config)
    return module_view(root, children) if children else root


def _changed_children(module: nn.Module, rebuild: Callable[[nn.Module], nn.Module]) -> dict[str, nn.Module]:
    """``{name: rebuild(child)}`` for ``module``'s children that ``rebuild`` changed."""
    changed = {}
    for name, child in module._modules.items():
        if child is not None:
            new = rebuild(child)
            if new is not child:
                changed[name] = new
    return changed


def model_configs(model: nn.Module) -> list:
    """The model's config and its text config (where they differ): the ones its attention layers read."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return [config] if text is config else [config, text]


def attention_view(model: nn.Module, implementation: str) -> nn.Module:
    """A view of ``model`` whose attention layers call the attention function registered as ``implementation``
    (transformers' `AttentionInterface`); the model itself, which other threads may be running, is left as it is."""
    originals = model_configs(model)
    configs = {id(config): config_view(config, **{ATTN_IMPLEMENTATION_FIELD: implementation}) for config in originals}
    for config in originals:  # a config's sub-config (the text config) is viewed with it
        for name, value in config.__dict__.items():
            if id(value) in configs and value is not config:
                configs[id(config)].__dict__[name] = configs[id(value)]
    return with_configs(model, configs)
