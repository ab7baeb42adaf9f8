"""Name -> class registries (the pattern of verl's ``register_policy_loss``): gates and KL controllers."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T", bound=type)


def registrar(registry: dict[str, T], base: type, what: str) -> Callable[[str], Callable[[T], T]]:
    """``register(name)``: a class decorator that adds a ``base`` subclass to ``registry`` under ``name`` and
    sets its ``name``; a name already taken by another class raises."""

    def register(name: str) -> Callable[[T], T]:
        def decorator(cls: T) -> T:
            if not (isinstance(cls, type) and issubclass(cls, base)):
                raise TypeError(
                    f"register_{what}({name!r}) decorates a {base.__name__} subclass, got {cls!r}"
                )
            if name in registry and registry[name] is not cls:
                raise ValueError(
                    f"a {what.replace('_', ' ')} named {name!r} is already registered "
                    f"({registry[name].__name__})"
                )
            cls.name = name
            registry[name] = cls
            return cls

        return decorator

    return register
