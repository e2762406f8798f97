"""``nn.ModuleList`` as the type checker sees it: typed by its children.

torch types a ``ModuleList``'s items as plain ``Module`` (and their attributes, through
``Module.__getattr__``, as ``Tensor | Module``).  The ``ModuleList`` here is torch's own at run
time; only mypy sees it generic, so ``ModuleList(TransformerLayer(cfg) for ...)`` iterates and
indexes as ``TransformerLayer``.  State-dict keys, repr and behaviour are torch's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar, overload

from torch import nn

M = TypeVar("M", bound=nn.Module)

if TYPE_CHECKING:

    class ModuleList(nn.ModuleList, Generic[M]):
        def __init__(self, modules: Iterable[M] | None = None) -> None: ...

        def __iter__(self) -> Iterator[M]: ...

        @overload
        def __getitem__(self, idx: slice) -> ModuleList[M]: ...

        @overload
        def __getitem__(self, idx: int) -> M: ...

        def __getitem__(self, idx: int | slice) -> M | ModuleList[M]: ...
else:
    ModuleList = nn.ModuleList
