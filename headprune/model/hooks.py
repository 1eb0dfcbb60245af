"""The one module that attaches anything to a model's modules: torch hooks, forward wrappers and stand-ins.

Everything else in headprune asks this module, so one place decides what runs, in which order, and what a copy
of a model carries over. Three tools, in the style of accelerate's ``ModelHook`` / ``add_hook_to_module``:

Named hooks (:class:`Hook`)
    A hook on a module's input (``pre``) or output (``post``) with a name and a :class:`Stage`. Attach them for
    the length of a ``with`` block with :func:`attached` (or :func:`attach` / :func:`detach`). Per module one
    torch hook dispatches to every attached Hook in stage order (ties: attach order), so the order of two hooks
    never depends on which caller attached first: gating scales a block's context at ``Stage.GATE``, live
    evaluation caches the context *before* the gate (``gating.BEFORE_GATE``), criteria record what O receives
    after it (``Stage.OBSERVE``).

    pre hook   ``fn(module, args, kwargs)``          returns None, or the ``(args, kwargs)`` the module gets
    post hook  ``fn(module, args, kwargs, output)``  returns None, or the output the caller gets

Forward wrappers (:func:`wrap_forward`, :func:`wrapped_forward`, :func:`replace_forward`)
    A function *around* whatever forward the module has now (the class method, accelerate's hook-bound
    forward, or an earlier wrap): ``wrapper(module, inner, *args, **kwargs)``. Safe on models accelerate has
    dispatched (it stores its ``forward`` as an instance attribute; undoing restores that exact attribute).
    ``wrap_forward`` is permanent until undone (surgery's zero-head cores, Phi-3's per-core counts: part of what
    the model *is*, so copies keep it); ``wrapped_forward`` is temporary (a ``with`` block), and copies drop it.

Stand-ins (:class:`StandIn`, :func:`standing_in`)
    A module that takes another's *place* in a ModuleList while reading its plain attributes through
    (``attention_type``, ``layer_idx``), so model code that chooses masks by a layer's position or attributes
    still sees what it expects. Running from layer l (``layers.py``) is built on these.

Private copies (:func:`structural_copy`)
    New module objects over the *same* weight tensors, with no torch hook, no attached Hook and no temporary
    wrapper: what a computation gates and hooks instead of a model other threads can see.
"""

from __future__ import annotations

import copy
import itertools
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from torch import nn

PreFn = Callable[..., Any]    # (module, args, kwargs) -> None | (args, kwargs)
PostFn = Callable[..., Any]   # (module, args, kwargs, output) -> None | output
ForwardWrapper = Callable[..., Any]  # (module, inner_forward, *args, **kwargs) -> output


class Stage(IntEnum):
    """Where a hook runs among the hooks of the same module (lower first)."""

    EARLY = 10      # sees the tensor before anything changes it (live evaluation caches an ungated context)
    CHANGE = 20     # changes it (gating scales per-head contexts; a graph is forced onto the embeddings)
    OBSERVE = 30    # sees what the module finally receives or returns (recorders, counters)


@dataclass(eq=False)
class Hook:
    """A named hook on one module's input (``kind="pre"``) or output (``kind="post"``)."""

    name: str
    module: nn.Module
    fn: PreFn | PostFn
    kind: str = "pre"
    stage: int = Stage.OBSERVE
    order: int = field(default=0, init=False)   # attach sequence, the tie-break within a stage

    def __post_init__(self):
        if self.kind not in ("pre", "post"):
            raise ValueError(f"Hook kind must be 'pre' or 'post', not {self.kind!r}")


def pre_hook(module: nn.Module, fn: PreFn, name: str, stage: int = Stage.OBSERVE) -> Hook:
    return Hook(name, module, fn, "pre", stage)


def post_hook(module: nn.Module, fn: PostFn, name: str, stage: int = Stage.OBSERVE) -> Hook:
    return Hook(name, module, fn, "post", stage)


# -- dispatch ---------------------------------------------------------------------------------------------------

_SLOT = "_headprune_hooks"          # module.__dict__ entry: the Hooks attached to that module
_SEQUENCE = itertools.count()


class _Attached:
    """The Hooks attached to one module and the two torch hooks that dispatch to them."""

    def __init__(self):
        self.pre: list[Hook] = []
        self.post: list[Hook] = []
        self.handles: dict[str, Any] = {}

    def __deepcopy__(self, memo):
        return None   # a copy of a module never carries another caller's hooks (see structural_copy)


def _state(module: nn.Module) -> _Attached | None:
    return module.__dict__.get(_SLOT)


def _run_pre(module, args, kwargs):
    state = _state(module)
    for hook in (state.pre if state is not None else ()):
        changed = hook.fn(module, args, kwargs)
        if changed is not None:
            args, kwargs = changed
    return args, kwargs


def _run_post(module, args, kwargs, output):
    state = _state(module)
    for hook in (state.post if state is not None else ()):
        changed = hook.fn(module, args, kwargs, output)
        if changed is not None:
            output = changed
    return output


def attach(hook: Hook) -> Hook:
    """Attach ``hook`` to its module (in stage order); returns it, for :func:`detach`."""
    module = hook.module
    state = _state(module)
    if state is None:
        state = _Attached()
        module.__dict__[_SLOT] = state
    hook.order = next(_SEQUENCE)
    hooks = getattr(state, hook.kind)
    hooks.append(hook)
    hooks.sort(key=lambda h: (h.stage, h.order))
    if hook.kind not in state.handles:  # the only torch registrations in headprune
        state.handles[hook.kind] = module.register_forward_pre_hook(_run_pre, with_kwargs=True) \
            if hook.kind == "pre" else module.register_forward_hook(_run_post, with_kwargs=True)
    return hook


def detach(hook: Hook) -> None:
    """Detach ``hook`` (a no-op when it is not attached); the torch hook goes with the module's last Hook."""
    state = _state(hook.module)
    if state is None:
        return
    hooks = getattr(state, hook.kind)
    if hook in hooks:
        hooks.remove(hook)
    if not hooks and hook.kind in state.handles:
        state.handles.pop(hook.kind).remove()
    if not state.pre and not state.post:
        hook.module.__dict__.pop(_SLOT, None)


@contextmanager
def attached(hooks: Iterable[Hook]) -> Iterator[list[Hook]]:
    """Within the block every hook of ``hooks`` is attached; all are detached on exit, whatever happens."""
    done: list[Hook] = []
    try:
        for hook in hooks:
            done.append(attach(hook))
        yield done
    finally:
        for hook in reversed(done):
            detach(hook)


def attached_names(module: nn.Module) -> list[str]:
    """Names of the Hooks attached to ``module``, in the order they run (pre hooks, then post hooks)."""
    state = _state(module)
    return [] if state is None else [h.name for h in state.pre + state.post]


# -- forward wrappers ---------------------------------------------------------------------------------------------

_CHAIN, _BASE = "_headprune_chain", "_headprune_base"


@dataclass(eq=False)
class _Wrap:
    fn: ForwardWrapper
    temporary: bool


def wrap_forward(module: nn.Module, wrapper: ForwardWrapper, temporary: bool = False) -> Callable[[], None]:
    """Make ``module(*a, **k)`` call ``wrapper(module, inner, *a, **k)``; returns a function that undoes it.

    ``inner`` calls the forward the module had before. The chain of wrappers and the forward underneath live in
    the module's ``__dict__``, so ``copy.deepcopy`` carries permanent wraps over, bound to the copy;
    :func:`structural_copy` drops the ``temporary`` ones.
    """
    chain = module.__dict__.get(_CHAIN)
    if chain is None:
        chain = []
        module.__dict__[_CHAIN] = chain
        module.__dict__[_BASE] = module.__dict__.get("forward")  # None: the class method
        module.forward = types.MethodType(_chained_forward, module)
    entry = _Wrap(wrapper, temporary)
    chain.append(entry)
    return lambda: _unwrap(module, entry)


def unwrap_forward(module: nn.Module, wrapper: ForwardWrapper) -> None:
    """Undo every wrap of ``module`` by the function ``wrapper``. Found by the function itself, this works on a
    deep copy too (its chain holds the same functions), where an undo returned for the original would not."""
    for entry in [e for e in module.__dict__.get(_CHAIN, []) if e.fn is wrapper]:
        _unwrap(module, entry)


def _unwrap(module: nn.Module, entry: _Wrap) -> None:
    chain = module.__dict__.get(_CHAIN, [])
    if entry in chain:
        chain.remove(entry)
    if not chain:
        base = module.__dict__.pop(_BASE, None)
        module.__dict__.pop(_CHAIN, None)
        if base is None:
            module.__dict__.pop("forward", None)
        else:
            module.forward = base


def _chained_forward(self: nn.Module, *args, **kwargs):
    chain = self.__dict__[_CHAIN]
    base = self.__dict__[_BASE]

    def call(level: int, *a, **k):
        if level < 0:
            return (type(self).forward.__get__(self) if base is None else base)(*a, **k)
        return chain[level].fn(self, lambda *a2, **k2: call(level - 1, *a2, **k2), *a, **k)

    return call(len(chain) - 1, *args, **kwargs)


def replace_forward(module: nn.Module, forward: Callable[..., Any]) -> Callable[[], None]:
    """Make ``module(*a, **k)`` call ``forward(module, *a, **k)`` instead of its own forward (permanently, until
    the returned function undoes it). For modules whose computation headprune supplies itself."""
    return wrap_forward(module, lambda self, _inner, *a, **k: forward(self, *a, **k))


@contextmanager
def wrapped_forward(wrappers: dict[nn.Module, ForwardWrapper]) -> Iterator[None]:
    """Within the block each module's forward is wrapped (see :func:`wrap_forward`); restored on exit."""
    undo = []
    try:
        for module, wrapper in wrappers.items():
            undo.append(wrap_forward(module, wrapper, temporary=True))
        yield
    finally:
        for fn in reversed(undo):
            fn()


def passthrough(arg_index: int = 0, kwarg: str = "hidden_states") -> ForwardWrapper:
    """A wrapper that skips the module and returns one of its inputs (positional ``arg_index`` or ``kwarg``)."""

    def skip(_module, _inner, *args, **kwargs):
        return args[arg_index] if len(args) > arg_index else kwargs[kwarg]

    return skip


# -- stand-ins ------------------------------------------------------------------------------------------------------

class StandIn(nn.Module):
    """Sits in ``original``'s slot and runs ``forward_fn`` instead; plain attributes read through to ``original``.

    ``original`` is held outside the module tree (not a child), so parameters are neither duplicated nor
    visible twice.
    """

    def __init__(self, original: nn.Module, forward_fn: Callable[..., Any]):
        super().__init__()
        object.__setattr__(self, "_original", original)
        object.__setattr__(self, "_forward_fn", forward_fn)

    def forward(self, *args, **kwargs):
        return self._forward_fn(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_original"), name)


@contextmanager
def standing_in(modules: nn.ModuleList, stand_ins: dict[int, nn.Module]) -> Iterator[None]:
    """Within the block ``modules[i]`` is ``stand_ins[i]`` for each i (list length and positions unchanged)."""
    originals = {i: modules[i] for i in stand_ins}
    try:
        for i, module in stand_ins.items():
            modules[i] = module
        yield
    finally:
        for i, module in originals.items():
            modules[i] = module


# -- private copies -------------------------------------------------------------------------------------------------

# torch's per-module hook tables. State-dict hooks are part of how a model loads and saves, so they stay.
_CALL_HOOK_TABLES = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                     "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
                     "_backward_pre_hooks")


def structural_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with its own module objects but the *same* parameter and buffer tensors, and no hooks.

    Hooks, wrappers and layer-list replacements on the copy leave ``model`` untouched; memory cost is only the
    Python module objects. Dropped from every module of the copy: every torch hook, every attached :class:`Hook`
    and every temporary wrapper -- a copy taken while another caller gates ``model`` would otherwise compute under
    that caller's mask for ever. Kept: what belongs to the model's own dispatch, accelerate's ``_hf_hook`` and the
    ``forward`` it stored, and permanent wraps (surgery's zero-head cores).

    Parameters
    ----------
    model : the module to copy (never changed).

    Returns
    -------
    The copy, in the same train/eval mode as ``model``.
    """
    memo = {id(t): t for t in model.parameters()}
    memo.update({id(t): t for t in model.buffers()})
    duplicate = copy.deepcopy(model, memo)
    for module in duplicate.modules():
        for table in _CALL_HOOK_TABLES:
            hooks = getattr(module, table, None)
            if hooks:
                setattr(module, table, type(hooks)())
        module.__dict__.pop(_SLOT, None)
        for entry in [e for e in module.__dict__.get(_CHAIN, []) if e.temporary]:
            _unwrap(module, entry)
    return duplicate
